# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: paged attention for decode (one query token per sequence), GQA aware.

A program owns one (sequence, KV head, context split): it loads the KV head's
group of query heads once, walks its share of the context in tiles of
`BLOCK_N` tokens gathered through the block table (token n lives in block
`block_tables[b, n // block_size]` at offset `n % block_size`, so any block
size and a partial last block work), and keeps an online softmax in float32
(base-2 exponentials, scale folded in). Each K/V tile is read once for the
whole query group, which is what makes GQA decode bandwidth-bound rather than
head-count-bound.

Short batches cannot fill a GPU with one program per (sequence, KV head), so
the context is split (flash-decoding): each split writes an unnormalised
partial (acc, max, sum) and `_combine_kernel` merges them. The split count is
chosen from the block-table width, known on the host, so no device sync is
needed. int8 caches are dequantised in the tile: scores are multiplied by the
per-token K scale, probabilities by the per-token V scale before `P @ V`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_attention, require
from hydrant.kernels.triton_support import (
    check_triton_device,
    dot_dtype,
    dot_precision,
    multiprocessor_count,
    next_power_of_2,
    require_contiguous,
    require_out,
    require_unit_stride,
)

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeTile:
    """Tokens per loop step, warps and pipeline depth of one decode program."""

    block_n: int
    num_warps: int
    num_stages: int


# By cache dtype (quantized or not): the best of the H200 sweep (bench/gpu_kernels.py
# --tune, 2026-12-04). float16 reads at 70-94% of copy bandwidth; int8 only at 31-43%
# (128 tokens a step is 1.45x its first 64-token tile, but still short of float16).
DECODE_TILES = {
    False: DecodeTile(block_n=64, num_warps=4, num_stages=3),
    True: DecodeTile(block_n=128, num_warps=4, num_stages=2),
}
NEG_BIG: tl.constexpr = tl.constexpr(-1.0e30)


@triton.jit
def _decode_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    context_lens_ptr,
    out_ptr,
    part_acc_ptr,
    part_stats_ptr,
    scale_log2,
    stride_qb,
    stride_qh,
    stride_bt,
    stride_ob,
    stride_oh,
    num_heads,
    num_kv_heads,
    head_dim,
    block_size,
    tokens_per_split,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANTIZED: tl.constexpr,
    SPLIT: tl.constexpr,
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + b)
    start = split * tokens_per_split
    end = tl.minimum(context_len, start + tokens_per_split)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < head_dim
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(COMPUTE)

    m_i = tl.full([BLOCK_G], NEG_BIG, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    row_stride = num_kv_heads * head_dim
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        block = tl.load(block_tables_ptr + b * stride_bt + n // block_size, mask=n_mask, other=0)
        slot = block.to(tl.int64) * block_size + n % block_size
        kv_offs = slot[:, None] * row_stride + kv_head * head_dim + d[None, :]
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(COMPUTE)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if QUANTIZED:
            k_s = tl.load(k_scale_ptr + slot * num_kv_heads + kv_head, mask=n_mask, other=0.0)
            s = s * k_s[None, :]
        s = tl.where(n_mask[None, :], s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(COMPUTE)
        if QUANTIZED:
            v_s = tl.load(v_scale_ptr + slot * num_kv_heads + kv_head, mask=n_mask, other=0.0)
            p = p * v_s[None, :]
        acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if SPLIT:
        part = (b * num_heads + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * head_dim + d[None, :], acc, mask=out_mask)
        tl.store(part_stats_ptr + part * 2, m_i, mask=g_mask)
        tl.store(part_stats_ptr + part * 2 + 1, l_i, mask=g_mask)
    else:
        safe_l = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / safe_l[:, None]
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit
def _combine_kernel(
    part_acc_ptr,
    part_stats_ptr,
    out_ptr,
    stride_ob,
    stride_oh,
    num_heads,
    head_dim,
    num_splits,
    BLOCK_S: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # Reads the split maxima at once (one float each), then the partial
    # accumulators CHUNK splits at a time, so registers stay bounded however
    # many splits a long context needed.
    b = tl.program_id(0)
    h = tl.program_id(1)
    base = (b * num_heads + h) * num_splits
    s = tl.arange(0, BLOCK_S)
    m_max = tl.max(
        tl.load(part_stats_ptr + (base + s) * 2, mask=s < num_splits, other=NEG_BIG), axis=0
    )
    d = tl.arange(0, BLOCK_D)
    d_mask = d < head_dim
    acc = tl.zeros([BLOCK_D], tl.float32)
    total = tl.zeros([CHUNK], tl.float32)
    for s0 in range(0, num_splits, CHUNK):
        c = s0 + tl.arange(0, CHUNK)
        c_mask = c < num_splits
        m = tl.load(part_stats_ptr + (base + c) * 2, mask=c_mask, other=NEG_BIG)
        l_s = tl.load(part_stats_ptr + (base + c) * 2 + 1, mask=c_mask, other=0.0)
        weight = tl.exp2(m - m_max)
        total += weight * l_s
        part = tl.load(
            part_acc_ptr + (base + c)[:, None] * head_dim + d[None, :],
            mask=c_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        acc += tl.sum(part * weight[:, None], axis=0)
    denom = tl.sum(total, axis=0)
    out = acc / tl.where(denom > 0.0, denom, 1.0)
    tl.store(
        out_ptr + b * stride_ob + h * stride_oh + d, out.to(out_ptr.dtype.element_ty), mask=d_mask
    )


def choose_num_splits(batch: int, num_kv_heads: int, capacity: int, device: torch.device) -> int:
    """Enough splits for about four programs per SM, none shorter than 256 tokens."""
    programs = batch * num_kv_heads
    target = 4 * multiprocessor_count(device)
    if programs >= target:
        return 1
    return max(1, min(math.ceil(target / programs), math.ceil(capacity / 256)))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Launch the decode kernel; `num_splits`, `block_n`, `num_warps` and `num_stages` are
    tuning knobs (tests pin the first two, bench/gpu_kernels.py sweeps them)."""
    quantized = check_attention(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale)
    check_triton_device(q.device)
    require_unit_stride(q, "q")
    require_unit_stride(block_tables, "block_tables")
    for name, tensor in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("k_scale", k_scale),
        ("v_scale", v_scale),
        ("context_lens", context_lens),
    ):
        if tensor is not None:
            require_contiguous(tensor, name)
    tile = DECODE_TILES[quantized]
    block_n = block_n or tile.block_n
    require(block_n >= 16 and block_n & (block_n - 1) == 0, "block_n must be a power of 2 >= 16")
    batch, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    require_out(out, "out", tuple(q.shape), q.dtype, q.device)
    if batch == 0:
        return out
    capacity = block_tables.shape[1] * block_size
    splits = num_splits or choose_num_splits(batch, num_kv_heads, capacity, q.device)
    require(splits >= 1, f"num_splits must be >= 1, got {splits}")
    tokens_per_split = triton.cdiv(triton.cdiv(max(capacity, 1), splits), block_n) * block_n
    group = num_heads // num_kv_heads
    block_d = next_power_of_2(head_dim)
    if splits > 1:
        part_acc = torch.empty(
            batch * num_heads * splits * head_dim, dtype=torch.float32, device=q.device
        )
        part_stats = torch.empty(
            batch * num_heads * splits * 2, dtype=torch.float32, device=q.device
        )
    else:
        part_acc = part_stats = out  # never touched: SPLIT is a constexpr False
    dummy = context_lens
    _decode_kernel[(batch, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        k_scale if k_scale is not None else dummy,
        v_scale if v_scale is not None else dummy,
        block_tables,
        context_lens,
        out,
        part_acc,
        part_stats,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_heads,
        num_kv_heads,
        head_dim,
        block_size,
        tokens_per_split,
        splits,
        GROUP=group,
        BLOCK_G=max(16, next_power_of_2(group)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        QUANTIZED=quantized,
        SPLIT=splits > 1,
        COMPUTE=dot_dtype(q.dtype),
        PRECISION=dot_precision(q.dtype),
        num_warps=num_warps or tile.num_warps,
        num_stages=num_stages or tile.num_stages,
    )
    if splits > 1:
        _combine_kernel[(batch, num_heads)](
            part_acc,
            part_stats,
            out,
            out.stride(0),
            out.stride(1),
            num_heads,
            head_dim,
            splits,
            BLOCK_S=next_power_of_2(splits),
            CHUNK=min(16, next_power_of_2(splits)),
            BLOCK_D=block_d,
            num_warps=4,
        )
    return out
