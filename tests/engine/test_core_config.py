"""Reading model configs of both transformers layouts, and the engine's own settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.errors import KVCacheCapacityError, ModelLoadError
from hydrant.engine.kv_cache import bytes_per_block, check_capacity, num_blocks_from_budget

LLAMA3_V4: dict[str, Any] = {  # as transformers < 5 wrote Llama 3.1's config
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "torch_dtype": "bfloat16",
    "eos_token_id": 128001,
}


def test_old_layout_llama3_config() -> None:
    config = ModelConfig.from_dict(LLAMA3_V4, {"eos_token_id": [128001, 128008, 128009]})
    assert config.head_dim == 128 and config.num_key_value_heads == 8
    assert config.rope_theta == 500000.0
    assert config.rope_scaling is not None and config.rope_scaling["rope_type"] == "llama3"
    assert "rope_theta" not in config.rope_scaling
    assert config.checkpoint_dtype == torch.bfloat16
    assert config.eos_token_ids == frozenset({128001, 128008, 128009})  # generation_config wins


def test_new_layout_and_family_switches() -> None:
    qwen = ModelConfig.from_dict(
        {
            **LLAMA3_V4,
            "architectures": ["Qwen2ForCausalLM"],
            "rope_scaling": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "tie_word_embeddings": True,
            "sliding_window": 4096,
            "use_sliding_window": False,
        }
    )
    assert qwen.qkv_bias and not qwen.o_bias and qwen.tie_word_embeddings
    assert qwen.rope_scaling is None and qwen.rope_theta == 1e6
    assert qwen.max_model_len == 131072  # Qwen2's window is off unless use_sliding_window
    mistral = ModelConfig.from_dict(
        {**LLAMA3_V4, "architectures": ["MistralForCausalLM"], "sliding_window": 4096}
    )
    assert mistral.max_model_len == 4096  # we attend fully, so the window caps the context
    assert not mistral.qkv_bias
    # Qwen3 (Qwen3-8B's config): q/k norms, head_dim apart from hidden / heads, every
    # attention projection biased only with attention_bias, its window off like Qwen2's.
    qwen3 = {
        **LLAMA3_V4,
        "architectures": ["Qwen3ForCausalLM"],
        "head_dim": 128,
        "hidden_size": 2560,
        "rope_scaling": None,
        "attention_bias": False,
        "sliding_window": None,
        "use_sliding_window": False,
        "max_window_layers": 36,
    }
    plain = ModelConfig.from_dict(qwen3)
    assert plain.qk_norm and plain.head_dim == 128
    assert not plain.qkv_bias and not plain.o_bias and plain.sliding_window is None
    biased = ModelConfig.from_dict({**qwen3, "attention_bias": True, "sliding_window": 4096})
    assert biased.qkv_bias and biased.o_bias and biased.max_model_len == 131072
    assert not qwen.qk_norm and not mistral.qk_norm
    # The embedding sizes a Matryoshka model may be cut to (None: not one; (): any).
    assert qwen.matryoshka_dimensions is None
    listed = ModelConfig.from_dict({**qwen3, "matryoshka_dimensions": [1024, 32, 256]})
    assert listed.matryoshka_dimensions == (32, 256, 1024)
    assert ModelConfig.from_dict({**qwen3, "is_matryoshka": True}).matryoshka_dimensions == ()


def test_broken_configs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelLoadError, match="hidden_size"):
        ModelConfig.from_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="multiple"):
        ModelConfig.from_dict({**LLAMA3_V4, "num_key_value_heads": 5})


@pytest.mark.parametrize(
    "settings",
    [
        {"block_size": 0},
        {"gpu_memory_utilization": 1.5},
        {"dtype": "float8"},
        {"device": "tpu"},
        {"num_gpu_blocks": 0},
    ],
)
def test_engine_config_rejects_nonsense(settings: dict[str, Any]) -> None:
    with pytest.raises(EngineConfigError):
        EngineConfig(**settings)


def test_kv_budget_arithmetic() -> None:
    config = ModelConfig.from_dict(LLAMA3_V4)
    # 2 (K, V) x 32 layers x 8 heads x 128 dims x 16 tokens x 2 bytes
    assert bytes_per_block(config, 16, torch.bfloat16) == 2 * 32 * 8 * 128 * 16 * 2
    engine = EngineConfig(kv_cache_bytes=1 << 30)
    assert num_blocks_from_budget(config, engine, torch.bfloat16, None) == (1 << 30) // (1 << 21)
    assert num_blocks_from_budget(config, EngineConfig(num_gpu_blocks=7), torch.float32, None) == 7
    assert EngineConfig().torch_dtype(torch.bfloat16) == torch.float32  # CPU: auto is float32
    assert EngineConfig(device="cuda").torch_dtype(torch.bfloat16) == torch.bfloat16
    check_capacity(16, 16, 256)
    with pytest.raises(KVCacheCapacityError, match="max_model_len=257"):
        check_capacity(16, 16, 257)
