"""A PEFT LoRA adapter read from disk: `adapter_config.json` + `adapter_model.safetensors`.

An adapter is a tenant's upload, so everything it says is checked against what the engine
computes before any of it reaches a device: a config PEFT would apply differently than
`y += scaling * (x @ A.T) @ B.T` on the seven Llama projections (DoRA, trained biases,
fully fine-tuned `modules_to_save`, per-module rank patterns, other targets) is refused by
name, as is a rank above the engine's `max_lora_rank` and any tensor whose shape does not
fit the base model. A refused adapter is the request's fault: `AdapterError` is an
`InvalidRequestError`, a 400 at the worker, never a failed engine.

Scaling is PEFT's: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.protocol import AdapterRef
from hydrant.engine.safetensors_reader import SafetensorsFile

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_BLOCK = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn"}
_BLOCK |= {"o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
_TENSOR = re.compile(
    r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight"
)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


class AdapterError(InvalidRequestError):
    """An adapter that cannot be served as the base model's LoRA; names the adapter."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"adapter {name!r} cannot be served: {why}", "model")


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each target projection of the base model."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    return {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter's weights on the host: (layer, module) -> (A [r, in], B [out, r])."""

    name: str
    rank: int
    scaling: float
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
    path: str  # the directory it was read from

    @property
    def key(self) -> str:
        """What the engine holds it under (`AdapterRef.key`: name and directory)."""
        return AdapterRef(name=self.name, path=self.path).key

    @property
    def modules(self) -> frozenset[str]:
        return frozenset(module for _, module in self.weights)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def read_lora_config(name: str, directory: Path, max_rank: int) -> tuple[int, float, list[str]]:
    """(rank, scaling, target modules) of a PEFT LoRA config the engine can serve."""
    path = directory / CONFIG_FILE
    try:
        raw: Any = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise AdapterError(name, f"{path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise AdapterError(name, f"{path} is not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise AdapterError(name, f"{CONFIG_FILE} is not a JSON object")
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterError(name, f"peft_type {raw.get('peft_type')!r} is not LORA")
    refused = {
        "use_dora": "DoRA adapters are not supported",
        "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "layers_to_transform": "adapters of some layers only are not supported",
        "fan_in_fan_out": "fan_in_fan_out weights (Conv1D models) are not supported",
    }
    for key, why in refused.items():
        if raw.get(key):
            raise AdapterError(name, why)
    if raw.get("bias", "none") != "none":
        raise AdapterError(name, f"bias={raw.get('bias')!r} is not supported (only 'none')")
    rank, alpha = raw.get("r"), raw.get("lora_alpha", raw.get("r"))
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(name, f"r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(name, f"rank {rank} exceeds this engine's max_lora_rank {max_rank}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise AdapterError(name, f"lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora") else alpha / rank
    targets = raw.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets:
        raise AdapterError(name, f"target_modules must list modules, got {targets!r}")
    other = sorted(str(t) for t in targets if t not in TARGET_MODULES)
    if other:
        raise AdapterError(
            name, f"target_modules {other} are not among {', '.join(TARGET_MODULES)}"
        )
    return rank, float(scaling), sorted(set(targets))


def load_adapter(
    name: str, path: str, config: ModelConfig, max_rank: int, dtype: torch.dtype
) -> LoraAdapter:
    """Read and check one adapter; its tensors in `dtype`, on the CPU."""
    directory = Path(path)
    rank, scaling, targets = read_lora_config(name, directory, max_rank)
    shapes = module_shapes(config)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise AdapterError(name, f"{weights_path} does not exist (only safetensors are read)")
    found: dict[tuple[int, str, str], torch.Tensor] = {}
    try:
        with SafetensorsFile(weights_path) as file:
            for entry in file.entries:
                match = _TENSOR.fullmatch(entry.name)
                if match is None or _BLOCK.get(match[3]) != match[2]:
                    why = f"tensor {entry.name!r} is not a supported LoRA weight"
                    raise AdapterError(name, why)
                layer, module, which = int(match[1]), match[3], match[4]
                if module not in targets or layer >= config.num_hidden_layers:
                    raise AdapterError(name, f"tensor {entry.name!r} is outside its target modules")
                found[(layer, module, which)] = file.read(entry).to(dtype)
    except AdapterError:
        raise
    except EngineError as exc:  # a damaged file: the reader's ModelLoadError
        raise AdapterError(name, str(exc)) from None
    except OSError as exc:
        raise AdapterError(name, f"cannot read {weights_path}: {exc.strerror}") from None
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in range(config.num_hidden_layers):
        for module in targets:
            a, b = found.get((layer, module, "A")), found.get((layer, module, "B"))
            where = f"layer {layer} {module}"
            if a is None or b is None:
                raise AdapterError(name, f"{where} has no lora_A/lora_B weight")
            n_in, n_out = shapes[module]
            if tuple(a.shape) != (rank, n_in) or tuple(b.shape) != (n_out, rank):
                raise AdapterError(
                    name,
                    f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit "
                    f"the base model (want {(rank, n_in)} and {(n_out, rank)})",
                )
            weights[(layer, module)] = (a, b)
    return LoraAdapter(name, rank, scaling, weights, path)
