"""The decode matrix-vector kernels (W8A16, W4A16) against the reference.

Shapes hit the edges: N not a multiple of `block_n`, K not a multiple of
`block_k` (W8A16), a group count not a multiple of the groups per tile
(W4A16), one to four activation rows, and each activation dtype. Every output
element is compared (and must be finite), and changing one channel's weights
must change that output alone, so a tile that writes the wrong rows fails.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import REL_TOL, rel_error

pytest.importorskip("triton")

from hydrant.kernels import quant_gemv, quant_matmul, reference
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.int4_layout import pack_int4

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
SMALL = quant_gemv.GemvConfig(block_n=16, block_k=64, num_warps=4, num_stages=2)
PLAIN = quant_gemv.GemvConfig(block_n=8, block_k=32, num_warps=2, num_stages=2, fast_convert=False)


@pytest.mark.parametrize(
    ("dtype", "m", "n", "k", "config"),
    [
        (F32, 1, 72, 200, SMALL),  # 200 = 3 tiles of 64 and a masked tail
        (F16, 3, 40, 256, SMALL),
        (BF16, 4, 33, 96, SMALL),
        (F32, 2, 50, 130, quant_gemv.W8A16_GEMV),  # one masked tile of the production shape
        (F16, 1, 20, 100, PLAIN),  # the conversion instruction instead of the bit trick
    ],
)
def test_w8a16_gemv(
    gen: torch.Generator, dtype: torch.dtype, m: int, n: int, k: int, config: quant_gemv.GemvConfig
) -> None:
    x = torch.randn(m, k, generator=gen).to(dtype)
    qweight = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    qweight[0, :2] = torch.tensor([-128, 127], dtype=torch.int8)  # both ends of the bit trick
    scales = (torch.rand(n, generator=gen) * 0.01 + 1e-3).to(dtype)
    out = quant_gemv.w8a16_gemv(x, qweight, scales, config=config)
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert rel_error(out, reference.w8a16_matmul(x, qweight, scales)) < REL_TOL[dtype]


@pytest.mark.parametrize(
    ("dtype", "m", "n", "k", "group", "config", "zero_dtype"),
    [
        (F32, 1, 72, 320, 64, SMALL, "float"),  # 5 groups, one per tile
        (F32, 2, 40, 320, 32, SMALL, torch.uint8),  # 10 groups, 2 per tile
        (F16, 4, 33, 384, 128, quant_gemv.W4A16_GEMV, torch.uint8),  # 3 groups, 4 per tile
        (BF16, 3, 24, 256, 64, SMALL, "float"),
        (F32, 1, 24, 256, 32, PLAIN, "float"),
    ],
)
def test_w4a16_gemv(
    gen: torch.Generator,
    dtype: torch.dtype,
    m: int,
    n: int,
    k: int,
    group: int,
    config: quant_gemv.GemvConfig,
    zero_dtype: torch.dtype | str,
) -> None:
    x = torch.randn(m, k, generator=gen).to(dtype)
    codes = torch.randint(0, 16, (n, k), generator=gen)
    codes[0, :2] = torch.tensor([0, 15])  # both ends of the bit trick
    qweight = pack_int4(codes)
    scales = (torch.rand(n, k // group, generator=gen) * 0.1 + 1e-3).to(dtype)
    zeros = torch.rand(n, k // group, generator=gen) * 15  # fractional zeros are allowed
    zeros_t = zeros.to(dtype) if zero_dtype == "float" else zeros.round().to(torch.uint8)
    out = quant_gemv.w4a16_gemv(x, qweight, scales, zeros_t, group, config=config)
    assert out.shape == (m, n) and torch.isfinite(out).all()
    expected = reference.w4a16_matmul(x, qweight, scales, zeros_t, group)
    assert rel_error(out, expected) < REL_TOL[dtype]


def test_each_output_depends_only_on_its_own_weights(gen: torch.Generator) -> None:
    """Changing one output channel's weights changes that output alone (no tile bleeds)."""
    x = torch.randn(2, 256, generator=gen)
    qweight = pack_int4(torch.randint(0, 16, (40, 256), generator=gen))
    scales, zeros = torch.rand(40, 4, generator=gen), torch.rand(40, 4, generator=gen) * 15
    before = quant_gemv.w4a16_gemv(x, qweight, scales, zeros, 64, config=SMALL)
    changed = qweight.clone()
    changed[17] ^= 0x5A
    after = quant_gemv.w4a16_gemv(x, changed, scales, zeros, 64, config=SMALL)
    differs = (after != before).any(dim=0)
    assert differs.nonzero().flatten().tolist() == [17]


def test_decode_batches_use_the_gemv_and_larger_ones_the_tiled_kernel(
    gen: torch.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = quant_matmul.w8a16_gemv

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append("gemv")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(quant_matmul, "w8a16_gemv", spy)
    qweight = torch.randint(-127, 128, (24, 64), generator=gen, dtype=torch.int8)
    scales = torch.rand(24, generator=gen)
    for m in (1, quant_gemv.GEMV_MAX_M, quant_gemv.GEMV_MAX_M + 1):
        x = torch.randn(m, 64, generator=gen)
        out = quant_matmul.w8a16_matmul(x, qweight, scales)
        assert rel_error(out, reference.w8a16_matmul(x, qweight, scales)) < 1e-3
    assert calls == ["gemv", "gemv"]


def test_gemv_launchers_reject_bad_arguments(gen: torch.Generator) -> None:
    x = torch.randn(1, 256, generator=gen)
    odd = quant_gemv.GemvConfig(block_n=12, block_k=64, num_warps=4, num_stages=2)
    with pytest.raises(KernelArgumentError, match="block_n must be a power of 2"):
        quant_gemv.w8a16_gemv(x, torch.zeros(8, 256, dtype=torch.int8), torch.ones(8), config=odd)
    with pytest.raises(KernelArgumentError, match="power-of-2 group_size"):
        quant_gemv.w4a16_gemv(
            x[:, :192],
            torch.zeros(8, 96, dtype=torch.uint8),
            torch.ones(8, 2),
            torch.ones(8, 2),
            96,
        )
    with pytest.raises(KernelArgumentError, match="qweight has dtype"):
        quant_gemv.w8a16_gemv(x, torch.zeros(8, 256, dtype=torch.uint8), torch.ones(8))
