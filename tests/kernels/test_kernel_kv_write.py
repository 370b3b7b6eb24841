"""KV-cache write kernel (Triton, interpreted) against the reference, for every cache dtype.

The caches start poisoned (NaN, or -128 codes that symmetric quantization
never produces, with NaN scales): the written slots must equal the
reference's and every other slot must still hold the poison.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hydrant.kernels import kv_write, ops, reference
from hydrant.kernels.errors import KernelArgumentError


def poisoned(shape: tuple[int, ...], dtype: torch.dtype | str) -> list[torch.Tensor | None]:
    if dtype == "int8":
        return [
            torch.full(shape, -128, dtype=torch.int8),
            torch.full(shape, -128, dtype=torch.int8),
            torch.full(shape[:3], float("nan")),
            torch.full(shape[:3], float("nan")),
        ]
    assert isinstance(dtype, torch.dtype)
    return [
        torch.full(shape, float("nan"), dtype=dtype),
        torch.full(shape, float("nan"), dtype=dtype),
        None,
        None,
    ]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16, torch.bfloat16, "int8"])
@pytest.mark.parametrize(("kv_heads", "head_dim"), [(1, 64), (4, 128), (3, 80)])
def test_write_kv_kernel_matches_reference(
    gen: torch.Generator, cache_dtype: torch.dtype | str, kv_heads: int, head_dim: int
) -> None:
    act = torch.bfloat16 if cache_dtype == "int8" else cache_dtype
    assert isinstance(act, torch.dtype)
    # K and V arrive as strided views of one fused projection output.
    fused = torch.randn(9, 3 * kv_heads, head_dim, generator=gen).to(act)
    key, value = fused[:, :kv_heads], fused[:, kv_heads : 2 * kv_heads]
    key[2] = 0.0  # an all-zero token: scale 0, codes 0
    slots = torch.tensor([0, 5, -1, 6, 15, 3, 9, -1, 16], dtype=torch.int64)
    shape = (5, 4, kv_heads, head_dim)
    ours, theirs = poisoned(shape, cache_dtype), poisoned(shape, cache_dtype)
    kv_write.write_kv(key, value, *ours[:2], slots, *ours[2:])
    reference.write_kv(key, value, *theirs[:2], slots, *theirs[2:])
    for mine, ref in zip(ours, theirs, strict=True):
        if mine is None or ref is None:
            assert mine is ref
            continue
        if mine.dtype == torch.int8:
            assert torch.equal(mine, ref)
        else:
            assert torch.equal(mine.isnan(), ref.isnan())
            assert torch.equal(mine.nan_to_num(), ref.nan_to_num())
    written = torch.zeros(20, dtype=torch.bool)
    written[slots[slots >= 0]] = True
    assert ours[0] is not None
    untouched = ours[0].reshape(20, -1)[~written]
    assert bool((untouched == -128).all() if cache_dtype == "int8" else untouched.isnan().all())


def test_write_kv_rejects_mismatched_cache(gen: torch.Generator) -> None:
    key = torch.randn(2, 2, 64, generator=gen)
    cache = torch.zeros(4, 4, 2, 64, dtype=torch.float16)
    slots = torch.tensor([0, 1])
    for backend in ("triton", "reference"):
        with pytest.raises(KernelArgumentError, match="only int8 caches convert"):
            ops.write_kv(key, key, cache, cache, slots, backend=backend)
        with pytest.raises(KernelArgumentError, match="need both k_scale and v_scale"):
            int8 = torch.zeros(4, 4, 2, 64, dtype=torch.int8)
            ops.write_kv(key, key, int8, int8, slots, backend=backend)
