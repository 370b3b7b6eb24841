"""Write LoRA adapters in PEFT's on-disk layout for a base checkpoint (test data factory).

Shapes follow the base model's config.json, as PEFT writes them: `lora_A` is
(r, in_features) and `lora_B` (out_features, r) for every targeted projection of every
layer. Shared by the adapter, CLI and e2e tests (they put this folder on `sys.path`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file


def _features(config: dict[str, Any], module: str) -> tuple[int, int]:
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[module]


def write_adapter(
    directory: Path,
    base_dir: Path,
    *,
    r: int = 4,
    targets: Sequence[str] = ("q_proj", "v_proj"),
    seed: int = 0,
    std: float = 0.02,
    config_overrides: dict[str, Any] | None = None,
) -> Path:
    """An adapter of `base_dir`'s model in `directory` (created); returns `directory`."""
    base = json.loads((base_dir / "config.json").read_text())
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(base["num_hidden_layers"]):
        for module in targets:
            group = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            fan_in, fan_out = _features(base, module)
            tensors[f"{prefix}.lora_A.weight"] = rng.normal(0, std, (r, fan_in)).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.normal(0, std, (fan_out, r)).astype(np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": str(base_dir),
        "r": r,
        "lora_alpha": 2 * r,
        "lora_dropout": 0.0,
        "target_modules": list(targets),
        "bias": "none",
        "use_rslora": False,
        "task_type": "CAUSAL_LM",
        **(config_overrides or {}),
    }
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory
