"""Check an adapter directory in PEFT's layout before it is registered, without torch.

Why at registration: an engine loads an adapter on its first request, so a wrong path or
an adapter of another base model would otherwise surface as a failed request on a tenant's
traffic. Here the admin gets the problem at once: the config is LoRA, its rank and target
modules are ones the engine serves, the weights file is there, and (reading only the
safetensors header) the LoRA matrices fit the base model's hidden and intermediate sizes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_RANK = 256
# The projections the engine applies LoRA to (issue #28), and which size of the base model
# each one reads (the input width of its `lora_A`; `o_proj` reads heads x head_dim).
TARGET_INPUTS = {
    "q_proj": "hidden_size",
    "k_proj": "hidden_size",
    "v_proj": "hidden_size",
    "o_proj": None,
    "gate_proj": "hidden_size",
    "up_proj": "hidden_size",
    "down_proj": "intermediate_size",
}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter directory says about itself, or every reason it cannot be served."""

    rank: int | None
    target_modules: tuple[str, ...]
    problems: tuple[str, ...]


def inspect_adapter(path: Path, base_path: Path | None = None) -> AdapterInfo:
    """Every problem of the adapter at `path` (checked against `base_path`'s config.json
    when that is readable: an API node may not hold the base checkpoint)."""
    if not path.is_dir():
        return AdapterInfo(None, (), (f"{path} is not a directory",))
    try:
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return AdapterInfo(None, (), (f"{CONFIG_FILE} is missing",))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return AdapterInfo(None, (), (f"{CONFIG_FILE} cannot be read: {exc}",))
    if not isinstance(config, dict):
        return AdapterInfo(None, (), (f"{CONFIG_FILE} is not a JSON object",))
    problems: list[str] = []
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        problems.append(f"peft_type is {peft_type!r}; only LORA adapters are served")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= MAX_RANK:
        problems.append(f"r must be an integer from 1 to {MAX_RANK}, not {rank!r}")
        rank = None
    alpha = config.get("lora_alpha", rank)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or alpha <= 0:
        problems.append(f"lora_alpha must be a positive number, not {alpha!r}")
    targets = _targets(config.get("target_modules"), problems)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        problems.append(f"{WEIGHTS_FILE} is missing")
    elif rank is not None and not problems:
        base = _base_config(base_path) if base_path is not None else None
        problems.extend(_shape_problems(weights, rank, config, base))
    return AdapterInfo(rank, targets, tuple(problems))


def _targets(value: Any, problems: list[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.append("target_modules must be a non-empty list of module names")
        return ()
    unknown = sorted(set(value) - set(TARGET_INPUTS))
    if unknown:
        supported = ", ".join(TARGET_INPUTS)
        problems.append(f"target_modules {unknown} are not served (supported: {supported})")
    return tuple(value)


def _base_config(base_path: Path) -> dict[str, Any] | None:
    try:
        config = json.loads((base_path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def read_safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names, dtypes, shapes): 8 bytes of
    little-endian length, then the JSON. Raises ValueError on anything else."""
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) != 8:
            raise ValueError("too short to be a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > MAX_HEADER_BYTES:
            raise ValueError("its header is implausibly large")
        header = json.loads(handle.read(size))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header


def _shape_problems(
    weights: Path, rank: int, config: dict[str, Any], base: dict[str, Any] | None
) -> list[str]:
    try:
        header = read_safetensors_header(weights)
    except (OSError, ValueError) as exc:
        return [f"{WEIGHTS_FILE} cannot be read: {exc}"]
    ranks = config.get("rank_pattern") or {}
    problems: list[str] = []
    found = 0
    for name, meta in header.items():
        if not name.endswith("lora_A.weight") or not isinstance(meta, dict):
            continue
        found += 1
        shape = meta.get("shape")
        if not isinstance(shape, list) or len(shape) != 2:
            problems.append(f"{name} is not a matrix")
            continue
        if not ranks and shape[0] != rank:
            problems.append(f"{name} has rank {shape[0]}, the config says r={rank}")
        module = name.removesuffix(".lora_A.weight").rsplit(".", 1)[-1]
        size = TARGET_INPUTS.get(module)
        expected = base.get(size) if base is not None and size is not None else None
        if isinstance(expected, int) and shape[1] != expected:
            problems.append(
                f"{name} reads {shape[1]} features, the base model's {size} is {expected}:"
                " an adapter of another base model"
            )
        if len(problems) >= 5:  # enough to see the pattern
            break
    if not found:
        problems.append(f"{WEIGHTS_FILE} holds no lora_A weights")
    return problems
