"""`quantize_model`, `QuantizedLinear` and the quantized checkpoint format, on a tiny HF Llama."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from kernel_testing import rel_error
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization import (
    QuantizedLinear,
    default_skip,
    kv_cache_bytes,
    kv_cache_report,
    load_quantized,
    quantize_model,
    read_quantization_manifest,
    rtn,
    save_quantized,
)
from hydrant.kernels.quantization.calibration import calibrate, search_channel_scale

CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 300,
    "max_position_embeddings": 128,
    "tie_word_embeddings": False,
}
LINEARS_PER_LAYER = 7  # q, k, v, o, gate, up, down


def tiny_llama(seed: int = 0, **overrides: Any) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**CONFIG, **overrides})).eval()


@torch.no_grad()
def logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits


@pytest.mark.parametrize(
    ("mode", "max_ratio", "max_err"), [("int8", 0.55, 0.02), ("int4", 0.30, 0.25)]
)
def test_quantize_model_replaces_linears_but_not_head(
    mode: str, max_ratio: float, max_err: float
) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 300, (2, 12))
    before = logits(model, ids)
    report = quantize_model(model, mode, 128)
    assert len(report.quantized) == 2 * LINEARS_PER_LAYER and report.skipped == ("lm_head",)
    assert isinstance(model.model.layers[1].mlp.down_proj, QuantizedLinear)
    assert type(model.lm_head) is nn.Linear
    assert report.bytes_after < report.bytes_before
    assert report.ratio_vs_float16 <= max_ratio
    assert report.model_bytes_before - report.model_bytes_after == (
        report.bytes_before - report.bytes_after
    )
    assert rel_error(logits(model, ids), before) < max_err


def test_int4_skips_layers_the_group_size_does_not_divide() -> None:
    model = tiny_llama(intermediate_size=192)  # down_proj has in_features 192
    report = quantize_model(model, "int4", 128)
    assert sorted(n for n in report.skipped if n != "lm_head") == [
        "model.layers.0.mlp.down_proj",
        "model.layers.1.mlp.down_proj",
    ]
    assert type(model.model.layers[0].mlp.down_proj) is nn.Linear


def test_custom_skip_replaces_the_default() -> None:
    model = tiny_llama()
    report = quantize_model(model, "int8", skip=lambda n: default_skip(n) or ".self_attn." in n)
    assert len(report.quantized) == 2 * 3
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear


def test_quantized_linear_keeps_bias_and_leading_dims(gen: torch.Generator) -> None:
    linear = nn.Linear(256, 40, bias=True)
    x = torch.randn(2, 3, 256, generator=gen)
    for mode in ("int8", "int4"):
        q = QuantizedLinear.from_linear(linear, mode, group_size=128)
        out = q(x)
        assert out.shape == (2, 3, 40)
        expected = x @ q.dequantized_weight().t() + linear.bias
        assert rel_error(out, expected) < 1e-5
        assert rel_error(out, linear(x)) < (0.01 if mode == "int8" else 0.15)


def test_rtn_int4_uses_the_full_code_range(gen: torch.Generator) -> None:
    weight = torch.randn(16, 256, generator=gen)
    packed, _, zeros = rtn.quantize_int4_groupwise(weight, 128, torch.float32)
    low, high = packed & 0xF, packed >> 4
    codes = torch.stack((low, high), -1).reshape(16, 256)
    assert int(codes.min()) == 0 and int(codes.max()) == 15
    assert bool(((zeros >= 0) & (zeros <= 15)).all())
    assert bool((zeros == zeros.round()).all())


def test_save_and_load_restore_the_quantized_model_without_requantizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 300, (1, 10))
    quantize_model(model, "int4", 64)
    expected = logits(model, ids)
    manifest = save_quantized(model, tmp_path)
    assert (tmp_path / "config.json").is_file()
    on_disk = json.loads((tmp_path / "hydrant_quantization.json").read_text())
    assert on_disk["mode"] == "int4" and on_disk["group_size"] == 64
    assert read_quantization_manifest(tmp_path) == manifest
    (tmp_path / "hydrant_quantization.json").unlink()  # the safetensors header alone suffices
    assert read_quantization_manifest(tmp_path) == manifest

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("loading must not quantize again")

    monkeypatch.setattr(rtn, "quantize_int4_groupwise", refuse)
    monkeypatch.setattr(rtn, "quantize_int8_per_channel", refuse)
    fresh = tiny_llama(seed=1)  # different float weights: everything must come from disk
    load_quantized(fresh, tmp_path)
    assert isinstance(fresh.model.layers[0].self_attn.q_proj, QuantizedLinear)
    assert torch.equal(logits(fresh, ids), expected)


def test_load_rejects_plain_and_mismatched_checkpoints(tmp_path: Path) -> None:
    assert read_quantization_manifest(tmp_path) is None
    with pytest.raises(KernelArgumentError, match="not a quantized checkpoint"):
        load_quantized(tiny_llama(), tmp_path)
    model = tiny_llama()
    quantize_model(model, "int8")
    save_quantized(model, tmp_path)
    with pytest.raises(KernelArgumentError, match="in the checkpoint"):
        load_quantized(tiny_llama(hidden_size=64), tmp_path)


def test_channel_scale_search_protects_outlier_channels(gen: torch.Generator) -> None:
    """With a few inputs channels 20x larger, the searched scale must beat plain RTN by 10%."""
    linear = nn.Linear(256, 64, bias=False)
    inputs = torch.randn(256, 256, generator=gen)
    inputs[:, :4] *= 20.0
    scale = search_channel_scale(linear, inputs, "int4", 128)
    reference = inputs @ linear.weight.detach().t()

    def error(channel_scale: torch.Tensor | None) -> float:
        q = QuantizedLinear.from_linear(linear, "int4", group_size=128, channel_scale=channel_scale)
        return float((inputs @ q.dequantized_weight().t() - reference).norm())

    assert error(scale) < 0.9 * error(None)


def test_calibrated_model_round_trips(tmp_path: Path) -> None:
    model = tiny_llama()
    calibration = [torch.randint(0, 300, (1, 24)) for _ in range(3)]
    ids = torch.randint(0, 300, (1, 16))
    scales = calibrate(model, calibration, "int4", 64)
    assert len(scales) == 2 * LINEARS_PER_LAYER
    quantize_model(model, "int4", 64, activation_scales=scales)
    assert model.model.layers[0].mlp.up_proj.input_scale is not None
    calibrated = logits(model, ids)
    save_quantized(model, tmp_path)
    fresh = tiny_llama(seed=3)
    load_quantized(fresh, tmp_path)
    assert torch.equal(logits(fresh, ids), calibrated)


def test_kv_cache_byte_report() -> None:
    assert kv_cache_bytes(2, 8, 128, 10, torch.float16) == 2 * 2 * 8 * 10 * 256
    assert kv_cache_bytes(2, 8, 128, 10, "int8") == 2 * 2 * 8 * 10 * (128 + 4)
    report = kv_cache_report(32, 8, 128, 4096)
    assert report.ratio == pytest.approx(132 / 256)
    with pytest.raises(KernelArgumentError):
        kv_cache_bytes(1, 1, 64, 1, torch.int32)
