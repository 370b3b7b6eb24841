"""One Hydrant linear as compressed-tensors pack-quantized tensors, held to the library itself.

compressed-tensors' own `PackedQuantizationCompressor` is the judge both ways:
its `decompress` must give back exactly the weight Hydrant multiplies by, and
its `compress`, handed that weight with Hydrant's scales and zero points, must
write the very tensors the writer wrote (so the bytes are what llm-compressor
would have saved, not merely something that decodes the same).
"""

from __future__ import annotations

import pytest
import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
from torch import nn

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization import QuantizedLinear
from hydrant.kernels.quantization.compressed_tensors_writer import (
    pack_quantized_tensors,
    quantization_config,
)
from hydrant.kernels.quantization.linear import QuantMode

GROUP = 64


def scheme_of(mode: QuantMode) -> QuantizationScheme:
    """The scheme the library reads back from the config the writer produces."""
    config = QuantizationConfig.model_validate(quantization_config(mode, GROUP, ["lm_head"]))
    return config.config_groups["group_0"]


def quantized(mode: QuantMode, dtype: torch.dtype, out_features: int = 36) -> QuantizedLinear:
    """A random linear quantized by Hydrant (36 rows: not a whole number of int32 words)."""
    torch.manual_seed(0)
    linear = nn.Linear(4 * GROUP, out_features, bias=True).to(dtype)
    return QuantizedLinear.from_linear(linear, mode, group_size=GROUP)


@pytest.mark.parametrize("mode", ["int4", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_library_decompresses_hydrants_weight_exactly(
    mode: QuantMode, dtype: torch.dtype
) -> None:
    module = quantized(mode, dtype)
    tensors = pack_quantized_tensors(module)
    assert all(t.is_contiguous() for t in tensors.values())  # safetensors writes no views
    restored = PackedQuantizationCompressor.decompress(tensors, scheme_of(mode))["weight"]
    assert restored.dtype == dtype
    # (q - z) is a small integer, so the product in the model's dtype is Hydrant's, rounded once
    assert torch.equal(restored, module.dequantized_weight().to(dtype))
    assert torch.equal(tensors["bias"], module.bias)


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_the_library_compresses_to_the_same_tensors(mode: QuantMode) -> None:
    module = quantized(mode, torch.float32)
    ours = pack_quantized_tensors(module)
    given = {"weight": module.dequantized_weight(), "weight_scale": ours["weight_scale"]}
    if mode == "int4":
        assert module.zeros is not None
        given["weight_zero_point"] = (module.zeros - 8).to(torch.int8)
    theirs = PackedQuantizationCompressor.compress(given, scheme_of(mode))
    assert sorted(theirs) == sorted(key for key in ours if key != "bias")
    for key, tensor in theirs.items():
        assert torch.equal(ours[key], tensor), key


@pytest.mark.parametrize("mode", ["int4", "int8"])
def test_a_row_range_is_that_part_alone(mode: QuantMode) -> None:
    module = quantized(mode, torch.float32, out_features=48)
    part = pack_quantized_tensors(module, slice(16, 40))
    restored = PackedQuantizationCompressor.decompress(part, scheme_of(mode))["weight"]
    assert part["weight_shape"].tolist() == [24, 4 * GROUP]
    assert torch.equal(restored, module.dequantized_weight()[16:40])


def test_the_config_is_what_llm_compressor_writes() -> None:
    for mode, strategy, symmetric, bits in (
        ("int8", "channel", True, 8),
        ("int4", "group", False, 4),
    ):
        raw = quantization_config(mode, GROUP, ["lm_head", "model.layers.0.mlp.down_proj"])
        assert raw["quant_method"] == "compressed-tensors" and raw["format"] == "pack-quantized"
        assert raw["quantization_status"] == "compressed"
        config = QuantizationConfig.model_validate(raw)
        weights = config.config_groups["group_0"].weights
        assert weights is not None
        assert (weights.strategy, weights.symmetric, weights.num_bits) == (
            strategy,
            symmetric,
            bits,
        )
        assert weights.group_size == (GROUP if mode == "int4" else None)
        assert config.config_groups["group_0"].input_activations is None
        assert config.ignore == ["lm_head", "model.layers.0.mlp.down_proj"]


def test_refuses_an_activation_aware_input_scale() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(GROUP, 8)
    module = QuantizedLinear.from_linear(
        linear, "int4", group_size=GROUP, channel_scale=torch.rand(GROUP) + 0.5
    )
    with pytest.raises(KernelArgumentError, match="activation-aware calibration"):
        pack_quantized_tensors(module, name="model.layers.0.mlp.down_proj")


def test_refuses_zero_points_between_integers() -> None:
    module = quantized("int4", torch.float32)
    assert module.zeros is not None
    module.zeros[3, 1] += 0.5
    with pytest.raises(KernelArgumentError, match=r"not integers in 0\.\.15"):
        pack_quantized_tensors(module, name="model.layers.0.mlp.down_proj")
