"""Model shapes for the capacity calculator: parameter counts and KV geometry, no torch.

The calculator runs on an operator's laptop (`hydrant capacity`) before any
GPU is rented, so a shape comes from a checkpoint's config.json or from the
built-in table of well-known models, whose dimensions are those of their
published config.json files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydrant.engine.architectures import EMBEDDING_ARCHITECTURES
from hydrant.engine.errors import ModelLoadError
from hydrant.engine.hub_quant_config import parse_hub_quantization


class CapacityInputError(ValueError):
    """An input the capacity calculator cannot work with (unknown model, bad number)."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that decide its memory use."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_position_embeddings: int | None = None
    default_dtype: str = "bfloat16"

    @property
    def linear_rows_per_layer(self) -> int:
        """Output rows of one layer's q, k, v, o, gate, up and down projections."""
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        return q + 2 * kv + self.hidden_size + 2 * self.intermediate_size + self.hidden_size

    @property
    def linear_params(self) -> int:
        """Weights of the decoder layers' projections: what weight-only quantization shrinks."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i
        return self.num_layers * per_layer

    def lora_slot_params(self, rank: int) -> int:
        """Parameters of one LoRA slot at `rank` on every projection, as the engine stacks
        them (engine/lora_slots.py: per fused projection, rank x parts rows of A over its
        input, and its outputs x rank x parts columns of B)."""
        h, i = self.hidden_size, self.intermediate_size
        q = self.num_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        qkv = 3 * rank * (h + q + 2 * kv)
        gate_up = 2 * rank * (h + 2 * i)
        per_layer = qkv + rank * (q + h) + gate_up + rank * (i + h)
        return self.num_layers * per_layer

    @property
    def other_params(self) -> int:
        """Embeddings, LM head, norms and biases: kept in the compute dtype."""
        embed = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embed
        norms = self.num_layers * 2 * self.hidden_size + self.hidden_size
        bias = 0
        if self.qkv_bias:
            bias = self.num_layers * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        return embed + lm_head + norms + bias

    @property
    def param_count(self) -> int:
        return self.linear_params + self.other_params

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str = "") -> ModelShape:
        """Read a HF config.json dict (Llama, Qwen2, Mistral field names)."""
        try:
            heads = int(config["num_attention_heads"])
            hidden = int(config["hidden_size"])
            head_dim = config.get("head_dim") or hidden // heads
            dtype = (
                _hub_weight_dtype(config)
                or config.get("torch_dtype")
                or config.get("dtype")
                or "bfloat16"
            )
            return cls(
                name=name or str(config.get("model_type", "model")),
                num_layers=int(config["num_hidden_layers"]),
                hidden_size=hidden,
                num_heads=heads,
                num_kv_heads=int(config.get("num_key_value_heads") or heads),
                head_dim=int(head_dim),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                # a bare decoder (an embedding model) has no LM head to count
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False))
                or any(a in EMBEDDING_ARCHITECTURES for a in config.get("architectures") or []),
                qkv_bias=config.get("model_type") == "qwen2"
                or bool(config.get("attention_bias", False)),
                max_position_embeddings=config.get("max_position_embeddings"),
                default_dtype=str(dtype),
            )
        except KeyError as exc:
            raise CapacityInputError(f"config.json lacks the field {exc.args[0]!r}") from exc
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise CapacityInputError(f"config.json has an unusable value: {exc}") from exc


NAMED_SHAPES: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000,
                   max_position_embeddings=4096, default_dtype="float16"),
        ModelShape("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256,
                   max_position_embeddings=8192),
        ModelShape("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256,
                   max_position_embeddings=8192),
        ModelShape("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000,
                   max_position_embeddings=32768),
        ModelShape("qwen2-7b", 28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True,
                   max_position_embeddings=32768),
    )
}  # fmt: skip


def _hub_weight_dtype(config: Mapping[str, Any]) -> str | None:
    """`int4` / `int8` for an AWQ, GPTQ or compressed-tensors checkpoint the engine loads:
    its projections stay quantized in memory, so they are sized so."""
    section = config.get("quantization_config")
    if section is None:
        return None
    try:
        return parse_hub_quantization(section).mode
    except ModelLoadError:
        return None  # the engine refuses it; the float estimate stands


def resolve_shape(model: str | Path) -> ModelShape:
    """A named shape ("llama-3-8b") or a checkpoint directory (or its config.json)."""
    key = str(model).strip().lower()
    if key in NAMED_SHAPES:
        return NAMED_SHAPES[key]
    path = Path(model)
    config_file = path / "config.json" if path.is_dir() else path
    if not config_file.is_file():
        known = ", ".join(sorted(NAMED_SHAPES))
        raise CapacityInputError(
            f"{model!s} is neither a known model ({known}) nor a checkpoint with a config.json"
        )
    try:
        config = json.loads(config_file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise CapacityInputError(f"cannot read {config_file}: {exc}") from exc
    if not isinstance(config, dict):
        raise CapacityInputError(f"{config_file} does not hold a JSON object")
    return ModelShape.from_config(config, name=path.name if path.is_dir() else path.parent.name)
