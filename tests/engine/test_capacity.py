"""Capacity arithmetic, checked against hand-worked numbers and real HF parameter counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from hydrant.engine.capacity import (
    GIB,
    NAMED_SHAPES,
    CapacityInputError,
    RequestLengths,
    format_report,
    kv_bytes_per_token,
    plan_capacity,
    resolve_shape,
    weight_bytes,
)
from hydrant.engine.capacity_shapes import ModelShape

TINY: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize("tie", [False, True])
def test_param_count_equals_transformers_models(tie: bool) -> None:
    llama_config = LlamaConfig(**TINY, tie_word_embeddings=tie)
    qwen_config = Qwen2Config(**TINY, tie_word_embeddings=tie)
    models = [
        (llama_config, LlamaForCausalLM(llama_config)),
        (qwen_config, Qwen2ForCausalLM(qwen_config)),
    ]
    for config, model in models:
        real = sum(p.numel() for p in model.parameters())
        assert ModelShape.from_config(config.to_dict()).param_count == real


def test_named_shapes_have_their_published_sizes() -> None:
    billions = {name: shape.param_count / 1e9 for name, shape in NAMED_SHAPES.items()}
    assert billions["llama-3-8b"] == pytest.approx(8.03, abs=0.01)
    assert billions["llama-3-70b"] == pytest.approx(70.55, abs=0.01)
    assert billions["llama-2-7b"] == pytest.approx(6.74, abs=0.01)
    assert billions["mistral-7b"] == pytest.approx(7.24, abs=0.01)
    assert billions["qwen2-7b"] == pytest.approx(7.62, abs=0.01)
    # KV per token: 2 (K and V) x layers x KV heads x head_dim x 2 bytes
    assert kv_bytes_per_token(NAMED_SHAPES["llama-3-8b"], "float16") == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(NAMED_SHAPES["llama-2-7b"], "float16") == 2 * 32 * 32 * 128 * 2
    assert kv_bytes_per_token(NAMED_SHAPES["llama-3-8b"], "int8") == 2 * 32 * 8 * (128 + 4)


def test_field_example_256_sequences_do_not_fit_an_80gb_gpu_at_long_outputs() -> None:
    """80 GB, 512-token inputs, block 16, max_num_seqs 256 (vLLM's default), Llama-3-8B."""
    shape = resolve_shape("llama-3-8b")
    # Weights by hand: embeddings + LM head + 32 layers (attention with GQA, SwiGLU MLP, norms).
    per_layer = 4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * per_layer + 2 * 128256 * 4096 + 4096
    assert shape.param_count == params == 8_030_261_248
    budget = int(80 * GIB * 0.9)
    kv_cache = budget - params * 2 - GIB  # bf16 weights, 1 GiB reserve
    block = 2 * 32 * 8 * 128 * 2 * 16  # 128 KiB per token x 16 tokens = 2 MiB
    blocks = kv_cache // block
    assert blocks == 28_693

    long_outputs = plan_capacity(
        shape,
        device_memory_gib=80,
        requests=RequestLengths.fixed(prompt=512, output=1536),
        block_size=16,
        max_num_seqs=256,
    )
    assert long_outputs.weight_bytes == params * 2
    assert long_outputs.num_blocks == blocks
    assert long_outputs.kv_tokens == blocks * 16
    assert long_outputs.blocks_per_p99_seq == 2048 // 16
    assert long_outputs.safe_max_num_seqs == blocks // 128 == 224
    assert long_outputs.safe_max_num_seqs < 256
    assert any("max_num_seqs=256 cannot all fit" in w for w in long_outputs.warnings)
    # In flight a sequence holds its prompt and half its output on average: 1280 tokens.
    assert long_outputs.mean_blocks_per_seq == 80
    assert long_outputs.fits_at_mean == blocks // 80
    assert long_outputs.expected_concurrency == 256

    short_outputs = plan_capacity(
        shape,
        device_memory_gib=80,
        requests=RequestLengths.fixed(prompt=512, output=512),
        max_num_seqs=256,
    )
    assert short_outputs.safe_max_num_seqs == blocks // 64 == 448
    assert short_outputs.warnings == []


def test_without_gqa_the_same_card_holds_far_fewer_sequences() -> None:
    """Llama-2-7B keeps 32 KV heads: 4x the KV per token of Llama-3-8B."""
    plan = plan_capacity(
        resolve_shape("llama-2-7b"),
        device_memory_gib=80,
        requests=RequestLengths.fixed(prompt=512, output=512),
        max_num_seqs=256,
    )
    kv_cache = int(80 * GIB * 0.9) - 6_738_415_616 * 2 - GIB
    assert plan.num_blocks == kv_cache // (2 * 32 * 32 * 128 * 2 * 16) == 7481
    assert plan.safe_max_num_seqs == 7481 // 64 == 116
    assert plan.warnings


def test_partial_last_blocks_are_counted() -> None:
    plan = plan_capacity(
        resolve_shape("mistral-7b"),
        device_memory_gib=24,
        requests=RequestLengths.fixed(prompt=500, output=13),
        weight_dtype="int4",
        kv_dtype="int8",
    )
    assert plan.blocks_per_p99_seq == 33  # 513 tokens: 32 full blocks and one with 1 token
    assert plan.safe_max_num_seqs == plan.num_blocks // 33


def test_quantized_weights_shrink_and_oversized_models_warn() -> None:
    shape = resolve_shape("llama-3-70b")
    fp16, int8, int4 = (weight_bytes(shape, d) for d in ("float16", "int8", "int4"))
    assert fp16 > int8 > int4
    assert int8 == shape.linear_params + 80 * shape.linear_rows_per_layer * 2 + (
        shape.other_params * 2
    )
    plan = plan_capacity(shape, device_memory_gib=80, requests=RequestLengths.fixed(1024, 1024))
    assert plan.num_blocks == 0
    assert plan.safe_max_num_seqs == 0
    assert "exceed the memory budget" in plan.warnings[0]
    fits = plan_capacity(
        shape, device_memory_gib=80, requests=RequestLengths.fixed(1024, 1024), weight_dtype="int4"
    )
    assert fits.num_blocks > 0
    assert fits.kv_dtype == "float16"


def test_shape_from_a_checkpoint_config(tmp_path: Path) -> None:
    config = {**TINY, "model_type": "qwen2", "torch_dtype": "float32"}
    (tmp_path / "config.json").write_text(json.dumps(config), "utf-8")
    shape = resolve_shape(tmp_path)
    assert shape.qkv_bias
    assert shape.head_dim == 16
    assert shape.default_dtype == "float32"
    plan = plan_capacity(
        shape, device_memory_gib=1, requests=RequestLengths.fixed(100, 28), reserve_gib=0
    )
    assert plan.weight_dtype == plan.kv_dtype == "float32"
    assert plan.warnings == []
    too_long = plan_capacity(
        shape, device_memory_gib=1, requests=RequestLengths.fixed(100, 29), reserve_gib=0
    )
    assert too_long.warnings == [
        "the p99 length (129 tokens) exceeds the model's context (128 tokens)"
    ]
    with pytest.raises(CapacityInputError, match="neither a known model"):
        resolve_shape(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}), "utf-8")
    with pytest.raises(CapacityInputError, match="num_attention_heads"):
        resolve_shape(tmp_path)


def test_lengths_from_samples_use_nearest_rank_p99() -> None:
    samples = [(100 + i, 10 * i) for i in range(100)]
    lengths = RequestLengths.from_samples(samples)
    assert lengths.prompt_p99 == 198
    assert lengths.output_p99 == 980
    assert lengths.prompt_mean == pytest.approx(149.5)
    with pytest.raises(CapacityInputError):
        RequestLengths.from_samples([])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"device_memory_gib": 0},
        {"block_size": 0},
        {"gpu_memory_utilization": 1.5},
        {"reserve_gib": -1},
        {"weight_dtype": "fp8"},
        {"kv_dtype": "int4"},
    ],
)
def test_bad_inputs_are_clear_errors(kwargs: dict[str, object]) -> None:
    args: dict[str, Any] = {"device_memory_gib": 80, **kwargs}
    with pytest.raises(CapacityInputError):
        plan_capacity(
            NAMED_SHAPES["llama-3-8b"],
            requests=RequestLengths.fixed(10, 10),
            **args,
        )


def test_report_lists_the_numbers_and_warnings() -> None:
    plan = plan_capacity(
        resolve_shape("llama-3-8b"),
        device_memory_gib=80,
        requests=RequestLengths.fixed(512, 1536),
        max_num_seqs=256,
    )
    report = format_report(plan)
    assert "KV blocks                28,693" in report
    assert "safe max_num_seqs        224" in report
    assert report.splitlines()[-1].startswith("WARNING: max_num_seqs=256")
