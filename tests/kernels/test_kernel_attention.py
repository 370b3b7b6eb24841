"""Paged decode and prefill attention kernels (Triton, interpreted) against the reference.

Shapes hit the edges: context lengths 1, block_size, block_size + 1 and odd
ones, in one batch; GQA ratios 1, 4, 8; head sizes 64 and 128; float32,
float16, bfloat16 and int8 caches; single-pass and split-context decode;
prefill chunks that start mid-context (prefix hits) and tiles smaller than a
chunk. Caches are NaN-poisoned outside each context and outputs are
NaN-filled before the call, so an out-of-context read or an unwritten
element fails.
"""

from __future__ import annotations

import pytest
import torch
from kernel_testing import REL_TOL, make_paged_kv, rel_error

pytest.importorskip("triton")

from hydrant.kernels import decode_attention, ops, prefill_attention, reference

BLOCK = 16
LENS = [1, BLOCK, BLOCK + 1, 37]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "int8", "splits"),
    [
        (4, 4, 64, torch.float32, False, 1),
        (8, 2, 64, torch.float32, False, 3),
        (8, 1, 128, torch.float32, False, 2),
        (8, 2, 128, torch.float16, False, 1),
        (4, 1, 64, torch.bfloat16, False, 2),
        (8, 2, 64, torch.float16, True, 2),
        (8, 1, 64, torch.float32, True, 1),
    ],
)
def test_decode_kernel_matches_reference(
    gen: torch.Generator,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    int8: bool,
    splits: int,
) -> None:
    kv = make_paged_kv(LENS, kv_heads, head_dim, BLOCK, dtype, gen, int8=int8)
    q = torch.randn(len(LENS), heads, head_dim, generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5
    decode_attention.paged_decode_attention(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.block_tables,
        kv.context_lens,
        scale,
        out=out,
        num_splits=splits,
        block_n=16,
        **kv.scales,
    )
    expected = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, scale, **kv.scales
    )
    assert not out.isnan().any()
    assert rel_error(out, expected) < REL_TOL[dtype]


def test_decode_kernel_default_split_choice_and_odd_block_size(gen: torch.Generator) -> None:
    """Block size 5 (not a power of 2) and the launcher's own split heuristic."""
    lens = [1, 5, 6, 23]
    kv = make_paged_kv(lens, 2, 64, 5, torch.float32, gen)
    q = torch.randn(4, 8, 64, generator=gen)
    out = ops.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125, backend="triton"
    )
    expected = reference.paged_decode_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125
    )
    assert rel_error(out, expected) < 1e-3


@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "dtype", "int8"),
    [
        (4, 4, 64, torch.float32, False),
        (8, 2, 64, torch.float32, False),
        (8, 1, 128, torch.float32, False),
        (4, 1, 128, torch.float16, False),
        (4, 2, 64, torch.bfloat16, False),
        (8, 2, 64, torch.float16, True),
    ],
)
def test_prefill_kernel_matches_reference(
    gen: torch.Generator,
    heads: int,
    kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    int8: bool,
) -> None:
    # A fresh prompt of one token, a full block, a block + 1 with a prefix hit of 13
    # tokens, an odd chunk deep in its context, and a sequence with no queries this step.
    context = [1, BLOCK, BLOCK + 1, 37, 9]
    q_lens = [1, BLOCK, 4, 21, 0]
    kv = make_paged_kv(context, kv_heads, head_dim, BLOCK, dtype, gen, int8=int8)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    scale = head_dim**-0.5
    prefill_attention.paged_prefill_attention(
        q,
        kv.k_cache,
        kv.v_cache,
        kv.block_tables,
        cu,
        kv.context_lens,
        scale,
        out=out,
        block_rows=16 * (heads // kv_heads),
        block_n=16,
        **kv.scales,
    )
    expected = reference.paged_prefill_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, scale, **kv.scales
    )
    assert not out.isnan().any()
    assert rel_error(out, expected) < REL_TOL[dtype]


def test_prefill_kernel_default_tiles_through_ops(gen: torch.Generator) -> None:
    context = [70, 3]  # queries: all 70 of the first, the last 2 of the second
    kv = make_paged_kv(context, 2, 64, 8, torch.float32, gen)
    cu = torch.tensor([0, 70, 72], dtype=torch.int32)
    q = torch.randn(72, 4, 64, generator=gen)
    out = ops.paged_prefill_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 0.125, backend="triton"
    )
    expected = reference.paged_prefill_attention(
        q, kv.k_cache, kv.v_cache, kv.block_tables, cu, kv.context_lens, 0.125
    )
    assert rel_error(out, expected) < 1e-3
