"""What a Hugging Face checkpoint is, read from its `config.json`.

Only the Llama family is implemented (Llama 2/3, Qwen2, Mistral share one
decoder: RMSNorm, RoPE, GQA, SwiGLU); they differ in a few switches (q/k/v
bias, tied embeddings, RoPE scaling), which this module turns into one typed
`ModelConfig`. Anything else is refused here, before weights are read.

Both config layouts are accepted: transformers < 5 writes `rope_theta` and
`rope_scaling` at the top level, transformers >= 5 a `rope_parameters` dict.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from hydrant.engine.architectures import EMBEDDING_ARCHITECTURES, SUPPORTED_ARCHITECTURES
from hydrant.engine.capacity_shapes import ModelShape
from hydrant.engine.engine_config import parse_dtype
from hydrant.engine.errors import ModelLoadError, UnsupportedModelError

Pooling = Literal["last", "mean", "cls"]
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})


@dataclass(frozen=True)
class ModelConfig:
    """The shape and switches of one Llama-family checkpoint."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    embedding_only: bool = False  # a bare decoder checkpoint: no LM head, no generation
    checkpoint_dtype: torch.dtype | None = None
    bos_token_id: int | None = None
    eos_token_ids: frozenset[int] = field(default_factory=frozenset)
    sliding_window: int | None = None
    # Embedding sizes a Matryoshka-trained model may be cut to: None when it is not one,
    # () when any size is fine (config.json's `is_matryoshka`), else its listed sizes.
    matryoshka_dimensions: tuple[int, ...] | None = None
    # How an embedding is pooled from the prompt's final hidden states (sentence-transformers'
    # Pooling module, when the checkpoint has one; decoder embedding models pool the last).
    pooling: Pooling = "last"

    @property
    def max_model_len(self) -> int:
        """Longest context we serve: a sliding window caps it, since we attend fully."""
        if self.sliding_window is not None:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @property
    def shape(self) -> ModelShape:
        """The dimensions the capacity calculator reads (parameter counts, KV geometry)."""
        return ModelShape(
            name=self.architecture,
            num_layers=self.num_hidden_layers,
            hidden_size=self.hidden_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            vocab_size=self.vocab_size,
        )

    @property
    def linear_params(self) -> int:
        """Weights of the decoder layers' projections (two FLOPs each per token, most of a
        token's compute): what sizes the engine's thread count (engine_config.py)."""
        return self.shape.linear_params

    @classmethod
    def from_pretrained(cls, model_dir: Path) -> ModelConfig:
        """Read `config.json` (and `generation_config.json` for EOS ids) from a directory."""
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(f"no config.json in {model_dir}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path} is not valid JSON: {exc}") from exc
        gen_path = Path(model_dir) / "generation_config.json"
        generation: dict[str, Any] = {}
        if gen_path.is_file():
            generation = json.loads(gen_path.read_text(encoding="utf-8"))
        return replace(cls.from_dict(raw, generation), pooling=read_pooling(Path(model_dir)))

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        """Build from the parsed JSON; raises UnsupportedModelError for other families."""
        architectures = raw.get("architectures") or []
        supported = [a for a in architectures if a in SUPPORTED_ARCHITECTURES]
        bare = [a for a in architectures if a in EMBEDDING_ARCHITECTURES]
        if not supported and not bare:
            raise UnsupportedModelError(
                f"unsupported architecture {architectures or '(none given)'}; Hydrant serves "
                f"{sorted(SUPPORTED_ARCHITECTURES)} and, for embeddings only, "
                f"{sorted(EMBEDDING_ARCHITECTURES)}"
            )
        arch = supported[0] if supported else EMBEDDING_ARCHITECTURES[bare[0]]
        if raw.get("hidden_act", "silu") != "silu":
            raise UnsupportedModelError(f"hidden_act {raw['hidden_act']!r} is not supported")
        try:
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            kv_heads = int(raw.get("num_key_value_heads") or heads)
            config = cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=kv_heads,
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=_rope_theta(raw),
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                rope_scaling=_rope_scaling(raw),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=arch == "Qwen2ForCausalLM" or bool(raw.get("attention_bias", False)),
                o_bias=arch in ("LlamaForCausalLM", "Qwen3ForCausalLM")
                and bool(raw.get("attention_bias", False)),
                qk_norm=arch == "Qwen3ForCausalLM",
                embedding_only=not supported,
                mlp_bias=bool(raw.get("mlp_bias", False)),
                checkpoint_dtype=parse_dtype(raw.get("dtype") or raw.get("torch_dtype")),
                bos_token_id=raw.get("bos_token_id"),
                eos_token_ids=_eos_ids(raw, generation or {}),
                sliding_window=_sliding_window(arch, raw),
                matryoshka_dimensions=_matryoshka(raw),
            )
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks required key {exc.args[0]!r}") from exc
        if heads % kv_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads ({heads}) is not a multiple of "
                f"num_key_value_heads ({kv_heads})"
            )
        return config


_POOLING_MODES: dict[str, Pooling] = {
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
}


def read_pooling(model_dir: Path) -> Pooling:
    """The pooling a sentence-transformers checkpoint declares (`modules.json` names its
    Pooling module's folder, whose `config.json` sets one `pooling_mode_*`), as vLLM reads
    it; `last` without one. A mode Hydrant cannot pool is refused at load rather than
    answered with vectors the model was not trained to give."""
    modules_path = model_dir / "modules.json"
    if not modules_path.is_file():
        return "last"
    try:
        modules = json.loads(modules_path.read_text(encoding="utf-8"))
        pooling = next((m for m in modules if str(m.get("type", "")).endswith(".Pooling")), None)
        if pooling is None:
            return "last"
        settings_path = model_dir / str(pooling.get("path", "")) / "config.json"
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ModelLoadError(f"cannot read the sentence-transformers pooling: {exc}") from exc
    modes = sorted(k for k, v in settings.items() if k.startswith("pooling_mode_") and v)
    if len(modes) != 1 or modes[0] not in _POOLING_MODES:
        raise UnsupportedModelError(
            f"sentence-transformers pooling {modes or '(none set)'} is not supported; Hydrant "
            f"pools one of {sorted(_POOLING_MODES)}"
        )
    return _POOLING_MODES[modes[0]]


def _matryoshka(raw: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The keys vLLM reads: `matryoshka_dimensions` (a list), or `is_matryoshka`."""
    listed = raw.get("matryoshka_dimensions")
    if isinstance(listed, list) and listed:
        return tuple(sorted({int(d) for d in listed}))
    return () if raw.get("is_matryoshka") is True else None


def _rope_params(raw: Mapping[str, Any]) -> dict[str, Any]:
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        return dict(params)
    scaling = raw.get("rope_scaling")
    return dict(scaling) if isinstance(scaling, dict) else {}


def _rope_theta(raw: Mapping[str, Any]) -> float:
    params = _rope_params(raw)
    return float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))


def _rope_scaling(raw: Mapping[str, Any]) -> dict[str, Any] | None:
    """The scaling dict (without rope_theta), or None for plain RoPE."""
    params = _rope_params(raw)
    params.pop("rope_theta", None)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope type {rope_type!r} is not supported (supported: {sorted(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        return None
    params["rope_type"] = rope_type
    return params


def _eos_ids(raw: Mapping[str, Any], generation: Mapping[str, Any]) -> frozenset[int]:
    """generation_config.json wins: Llama 3 lists its end-of-turn ids only there."""
    value = generation.get("eos_token_id", raw.get("eos_token_id"))
    if value is None:
        return frozenset()
    if isinstance(value, int):
        return frozenset({value})
    return frozenset(int(v) for v in value)


def _sliding_window(arch: str, raw: Mapping[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if window is None:
        return None
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and not raw.get(
        "use_sliding_window", False
    ):
        return None
    return int(window)
