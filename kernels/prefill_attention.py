# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: causal attention for prefill and chunked prefill over the paged cache.

Sequence b's `q_len = cu_seqlens_q[b+1] - cu_seqlens_q[b]` queries are the LAST
`q_len` positions of its `context_lens[b]` tokens, and every key, the earlier
context (prefix-cache hits, earlier chunks) and the chunk's own, is read from
the paged cache: the caller runs `write_kv` for the chunk first. So a fresh
prompt, a prompt with a cached prefix and the n-th chunk of a long prompt are
one code path, with no separate "K/V of this step" argument.

A program owns a tile of one sequence's queries for ALL query heads of one KV
head (rows = queries x group heads), so each K/V tile, gathered through the
block table, is loaded once per group rather than once per head. It walks
keys up to its last query's position in `BLOCK_N` tiles with a float32 online
softmax; the causal mask is applied per element (every tile, which also
covers the diagonal). Programs whose tile starts past a sequence's `q_len`
return at once, so the grid can be sized by the longest chunk. int8 caches
are dequantised in the tile as in the decode kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_attention, require
from hydrant.kernels.triton_support import (
    check_triton_device,
    dot_dtype,
    dot_precision,
    next_power_of_2,
    require_contiguous,
    require_out,
    require_unit_stride,
)

LOG2E = 1.4426950408889634
NEG_BIG: tl.constexpr = tl.constexpr(-1.0e30)


@triton.jit
def _prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    block_tables_ptr,
    cu_seqlens_ptr,
    context_lens_ptr,
    out_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_bt,
    stride_ot,
    stride_oh,
    num_kv_heads,
    head_dim,
    block_size,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANTIZED: tl.constexpr,
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_R // GROUP_PAD
    tile = tl.program_id(0)
    b = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_ptr + b)
    q_len = tl.load(cu_seqlens_ptr + b + 1) - q_start
    if tile * BLOCK_Q < q_len:
        context_len = tl.load(context_lens_ptr + b)
        first_pos = context_len - q_len
        # Row r of the tile is query (r // GROUP_PAD) of the tile, head r % GROUP_PAD of
        # this KV head's group: the whole group shares every K/V tile it loads.
        r = tl.arange(0, BLOCK_R)
        m = tile * BLOCK_Q + r // GROUP_PAD
        head = kv_head * GROUP + r % GROUP_PAD
        r_mask = (m < q_len) & (r % GROUP_PAD < GROUP)
        q_pos = first_pos + m
        d = tl.arange(0, BLOCK_D)
        d_mask = d < head_dim
        q_offs = (q_start + m)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
        q = tl.load(q_ptr + q_offs, mask=r_mask[:, None] & d_mask[None, :], other=0.0)
        q = q.to(COMPUTE)

        m_i = tl.full([BLOCK_R], NEG_BIG, tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        row_stride = num_kv_heads * head_dim
        key_end = tl.minimum(context_len, first_pos + (tile + 1) * BLOCK_Q)
        for n0 in range(0, key_end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_mask = n < key_end
            block = tl.load(
                block_tables_ptr + b * stride_bt + n // block_size, mask=n_mask, other=0
            )
            slot = block.to(tl.int64) * block_size + n % block_size
            kv_offs = slot[:, None] * row_stride + kv_head * head_dim + d[None, :]
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0).to(COMPUTE)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            if QUANTIZED:
                k_s = tl.load(k_scale_ptr + slot * num_kv_heads + kv_head, mask=n_mask, other=0.0)
                s = s * k_s[None, :]
            allowed = n_mask[None, :] & (n[None, :] <= q_pos[:, None])
            s = tl.where(allowed, s * scale_log2, float("-inf"))
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

        safe_l = tl.where(l_i > 0.0, l_i, 1.0)
        out = acc / safe_l[:, None]
        o_offs = (q_start + m)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(
            out_ptr + o_offs,
            out.to(out_ptr.dtype.element_ty),
            mask=r_mask[:, None] & d_mask[None, :],
        )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    block_rows: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Launch the prefill kernel; `block_rows` (query rows x group heads) and `block_n` tile it.

    `max_seqlen_q` (the longest chunk) sizes the grid; pass it when known, or
    it is read from `cu_seqlens_q`, which synchronises with the device.
    """
    quantized = check_attention(
        q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, cu_seqlens_q
    )
    check_triton_device(q.device)
    require_unit_stride(q, "q")
    require_unit_stride(block_tables, "block_tables")
    for name, tensor in (
        ("k_cache", k_cache),
        ("v_cache", v_cache),
        ("k_scale", k_scale),
        ("v_scale", v_scale),
        ("context_lens", context_lens),
        ("cu_seqlens_q", cu_seqlens_q),
    ):
        if tensor is not None:
            require_contiguous(tensor, name)
    for name, size in (("block_rows", block_rows), ("block_n", block_n)):
        require(size >= 16 and size & (size - 1) == 0, f"{name} must be a power of 2 >= 16")
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    require_out(out, "out", tuple(q.shape), q.dtype, q.device)
    batch = block_tables.shape[0]
    if num_tokens == 0 or batch == 0:
        return out
    if max_seqlen_q is None:
        max_seqlen_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
    if max_seqlen_q <= 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group)
    block_rows = max(block_rows, group_pad)
    dummy = context_lens
    grid = (triton.cdiv(max_seqlen_q, block_rows // group_pad), batch, num_kv_heads)
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        k_scale if k_scale is not None else dummy,
        v_scale if v_scale is not None else dummy,
        block_tables,
        cu_seqlens_q,
        context_lens,
        out,
        scale * LOG2E,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        num_kv_heads,
        head_dim,
        block_size,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_R=block_rows,
        BLOCK_N=block_n,
        BLOCK_D=next_power_of_2(head_dim),
        QUANTIZED=quantized,
        COMPUTE=dot_dtype(q.dtype),
        PRECISION=dot_precision(q.dtype),
        num_warps=4 if head_dim <= 64 else 8,
    )
    return out
