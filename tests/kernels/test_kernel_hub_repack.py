"""Repacking hub codes into Hydrant's layouts: per-channel groups, fusion, refusals.

The formats' bit layouts are checked end to end in tests/engine/test_hub_*.py
(against their specs and the compressed-tensors library); these pin the
shared plumbing's own rules on small tensors.
"""

from __future__ import annotations

import pytest
import torch

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.hub_compressed_tensors import repack_pack_quantized
from hydrant.kernels.quantization.hub_gptq import repack_gptq
from hydrant.kernels.quantization.hub_repack import (
    RepackedWeight,
    channel_group_size,
    fuse_rows,
    int4_from_codes,
    int8_from_codes,
    quantized_linear,
)
from hydrant.kernels.quantization.int32_packing import pack_int32


def _dequantized(weight: RepackedWeight) -> torch.Tensor:
    """The float32 weight the engine's module holding `weight` multiplies by."""
    return quantized_linear(weight, None, torch.float32).dequantized_weight()


def _random_int4(n: int, k: int, group: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=generator)
    zeros = torch.randint(0, 16, (n, k // group), generator=generator).float()
    scales = torch.rand(n, k // group, generator=generator) + 0.5
    return codes, zeros, scales


@pytest.mark.parametrize(("k", "group"), [(4096, 128), (11008, 128), (4000, 32), (6, 2), (7, 7)])
def test_a_per_channel_scale_spreads_over_the_largest_kernel_group(k: int, group: int) -> None:
    assert channel_group_size(k) == group


def test_per_channel_int4_is_repeated_exactly_over_groups() -> None:
    codes, zeros, scales = _random_int4(8, 256, 256)
    weight = int4_from_codes(codes, zeros, scales, 256)
    assert weight.group_size == 128 and weight.scales.shape == (8, 2)
    assert torch.equal(_dequantized(weight), (codes - zeros) * scales)


def test_fused_rows_dequantize_to_the_concatenated_parts() -> None:
    parts = [int4_from_codes(*_random_int4(n, 64, 32, seed=n), 32) for n in (16, 8, 8)]
    fused = fuse_rows(parts)
    assert (fused.out_features, fused.in_features) == (32, 64)
    assert torch.equal(_dequantized(fused), torch.cat([_dequantized(p) for p in parts]))
    module = quantized_linear(fused, torch.zeros(32), torch.float32)
    x = torch.randn(3, 64)
    assert torch.allclose(module(x), x @ _dequantized(fused).t(), atol=1e-5)


def test_parts_of_different_groups_or_modes_are_not_fused() -> None:
    a = int4_from_codes(*_random_int4(8, 64, 32), 32)
    b = int4_from_codes(*_random_int4(8, 64, 16), 16)
    with pytest.raises(KernelArgumentError, match="share mode, group size"):
        fuse_rows([a, b])
    c = int8_from_codes(torch.randint(-127, 128, (8, 64)), torch.rand(8))
    with pytest.raises(KernelArgumentError, match="share mode, group size"):
        fuse_rows([a, c])


def test_codes_out_of_range_are_refused() -> None:
    codes, zeros, scales = _random_int4(8, 64, 32)
    with pytest.raises(KernelArgumentError, match=r"0\.\.15"):
        int4_from_codes(codes + 16, zeros, scales, 32)


def test_reordered_gptq_rows_are_refused() -> None:
    k, n, group = 64, 16, 32
    qweight = pack_int32(torch.randint(0, 16, (k, n)), 4, dim=0)
    qzeros = pack_int32(torch.full((k // group, n), 7), 4, dim=1)
    scales = torch.rand(k // group, n)
    g_idx = (torch.arange(k) // group).to(torch.int32)
    assert repack_gptq(qweight, qzeros, scales, g_idx, group).group_size == group
    with pytest.raises(KernelArgumentError, match="g_idx"):
        repack_gptq(qweight, qzeros, scales, g_idx.flip(0), group)


def test_grouped_or_asymmetric_int8_is_refused() -> None:
    n, k = 8, 64
    packed = pack_int32(torch.randint(0, 256, (n, k)), 8, dim=1)
    shape = torch.tensor([n, k])
    assert repack_pack_quantized(packed, torch.rand(n, 1), shape, None, 8).mode == "int8"
    with pytest.raises(KernelArgumentError, match="symmetric per output channel"):
        repack_pack_quantized(packed, torch.rand(n, 2), shape, None, 8)
