"""W8A16 and W4A16 dequantizing matmul kernels against the reference.

M covers decode (1, 7) and prefill (33, 70) sizes, with N and K that are not
multiples of the tiles; explicit configs force split-K (including an uneven
split) so both the direct store and the float32 partial-sum path are checked.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import REL_TOL, rel_error

pytest.importorskip("triton")

from hydrant.kernels import ops, quant_matmul, reference
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.int4_layout import pack_int4

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SPLIT = quant_matmul.MatmulConfig(16, 32, 32, 3, 4, 2)  # 3-way split of 7 K tiles: uneven


@pytest.mark.parametrize(
    ("dtype", "m", "config"),
    [
        (F32, 1, None),
        (F32, 7, SPLIT),
        (F32, 70, None),
        (F16, 1, SPLIT),
        (F16, 70, None),
        (BF16, 7, None),
        (BF16, 1, SPLIT),
    ],
)
def test_w8a16_kernel(
    gen: torch.Generator, dtype: torch.dtype, m: int, config: quant_matmul.MatmulConfig | None
) -> None:
    x = torch.randn(m, 200, generator=gen).to(dtype)
    qweight = torch.randint(-127, 128, (72, 200), generator=gen, dtype=torch.int8)
    scales = (torch.rand(72, generator=gen) * 0.01).to(dtype)
    out = quant_matmul.w8a16_matmul(x, qweight, scales, config=config)
    assert out.shape == (m, 72) and out.dtype == dtype
    assert rel_error(out, reference.w8a16_matmul(x, qweight, scales)) < REL_TOL[dtype]


@pytest.mark.parametrize(
    ("dtype", "m", "config", "zero_dtype"),
    [
        (F32, 1, None, "float"),
        (F32, 33, None, torch.uint8),
        (F32, 7, SPLIT, "float"),
        (F16, 1, SPLIT, torch.uint8),
        (F16, 33, None, "float"),
        (BF16, 7, None, "float"),
        (BF16, 1, SPLIT, torch.uint8),
    ],
)
def test_w4a16_kernel(
    gen: torch.Generator,
    dtype: torch.dtype,
    m: int,
    config: quant_matmul.MatmulConfig | None,
    zero_dtype: torch.dtype | str,
) -> None:
    k, n, group = 256, 72, 64
    x = torch.randn(m, k, generator=gen).to(dtype)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen))
    scales = (torch.rand(n, k // group, generator=gen) * 0.1).to(dtype)
    zeros = torch.randint(0, 16, (n, k // group), generator=gen)
    zeros_t = zeros.to(dtype if zero_dtype == "float" else torch.uint8)
    out = quant_matmul.w4a16_matmul(x, qweight, scales, zeros_t, group, config=config)
    expected = reference.w4a16_matmul(x, qweight, scales, zeros_t, group)
    assert out.shape == (m, n) and rel_error(out, expected) < REL_TOL[dtype]


def test_w4a16_group_128_through_ops(gen: torch.Generator) -> None:
    x = torch.randn(3, 384, generator=gen)
    qweight = pack_int4(torch.randint(0, 16, (40, 384), generator=gen))
    scales = torch.rand(40, 3, generator=gen)
    zeros = torch.rand(40, 3, generator=gen) * 15  # non-integer zeros are allowed
    out = ops.w4a16_matmul(x, qweight, scales, zeros, 128, backend="triton")
    assert rel_error(out, reference.w4a16_matmul(x, qweight, scales, zeros, 128)) < 1e-3


def test_matmul_launchers_reject_bad_layouts(gen: torch.Generator) -> None:
    x = torch.randn(2, 256, generator=gen)
    with pytest.raises(KernelArgumentError, match="qweight has dtype"):
        quant_matmul.w8a16_matmul(x, torch.zeros(8, 256, dtype=torch.uint8), torch.ones(8))
    with pytest.raises(KernelArgumentError, match="bytes per row"):
        quant_matmul.w4a16_matmul(
            x, torch.zeros(8, 256, dtype=torch.uint8), torch.ones(8, 2), torch.ones(8, 2), 128
        )
    with pytest.raises(KernelArgumentError, match="power-of-2 group_size"):
        quant_matmul.w4a16_matmul(
            x[:, :192],
            torch.zeros(8, 96, dtype=torch.uint8),
            torch.ones(8, 2),
            torch.ones(8, 2),
            96,
        )
    with pytest.raises(KernelArgumentError, match="contiguous"):
        quant_matmul.w8a16_matmul(
            x.t().contiguous().t(), torch.zeros(8, 256, dtype=torch.int8), torch.ones(8)
        )
