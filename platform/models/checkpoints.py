"""Read a checkpoint directory's metadata without torch (API nodes have none).

Readiness and `hydrant models` need to know whether a configured directory
can be served before any engine touches it: the architecture is one we run,
the weights and tokenizer files are there, the shard index is complete, and
a hub quantization (AWQ, GPTQ, compressed-tensors) is one the engine loads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hydrant.engine.architectures import EMBEDDING_ARCHITECTURES, SUPPORTED_ARCHITECTURES
from hydrant.engine.errors import ModelLoadError
from hydrant.engine.hub_quant_config import parse_hub_quantization

# bare decoders (no LM head) too: embedding models, served for /v1/embeddings only
SERVABLE_ARCHITECTURES = SUPPORTED_ARCHITECTURES | set(EMBEDDING_ARCHITECTURES)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint directory says about itself, or why it cannot be served."""

    path: Path
    architecture: str | None
    max_model_len: int | None
    problems: tuple[str, ...]
    quantization: str | None = None  # a hub checkpoint's, e.g. "awq int4 g128"

    @property
    def loadable(self) -> bool:
        return not self.problems


def inspect_checkpoint(path: Path) -> CheckpointInfo:
    """Check the HF layout of `path`; every problem found is listed, not just the first."""
    problems: list[str] = []
    architecture: str | None = None
    max_len: int | None = None
    if not path.is_dir():
        return CheckpointInfo(path, None, None, (f"{path} is not a directory",))
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append("config.json is missing")
        config = {}
    except (OSError, json.JSONDecodeError) as exc:
        problems.append(f"config.json cannot be read: {exc}")
        config = {}
    architectures = config.get("architectures") or []
    if config:
        architecture = architectures[0] if architectures else None
        if architecture not in SERVABLE_ARCHITECTURES:
            supported = ", ".join(sorted(SERVABLE_ARCHITECTURES))
            problems.append(
                f"architecture {architecture!r} is not supported (supported: {supported})"
            )
        value = config.get("max_position_embeddings")
        max_len = int(value) if isinstance(value, int) else None
    quantization: str | None = None
    if config.get("quantization_config") is not None:
        try:
            quantization = parse_hub_quantization(config["quantization_config"]).describe()
        except ModelLoadError as exc:
            problems.append(str(exc))
    problems.extend(_weight_problems(path))
    if not (path / "tokenizer.json").is_file():
        problems.append("tokenizer.json is missing")
    return CheckpointInfo(path, architecture, max_len, tuple(problems), quantization)


def _weight_problems(path: Path) -> list[str]:
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            index = json.loads(index_file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            return [f"model.safetensors.index.json cannot be read: {exc}"]
        shards = sorted(set(index.get("weight_map", {}).values()))
        if not shards:
            return ["model.safetensors.index.json lists no shards"]
        return [f"shard {name} is missing" for name in shards if not (path / name).is_file()]
    if (path / "model.safetensors").is_file():
        return []
    return ["no model.safetensors or model.safetensors.index.json"]
