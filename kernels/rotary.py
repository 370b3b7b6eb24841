# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: rotary position embedding, neox / HF "rotate_half" layout.

For each token the kernel fetches one row `cat(cos, sin)` of the table built by
`hydrant.kernels.rope_cache.build_rope_cache` and rotates pairs `(x[i],
x[i + rot/2])` of every query and key head. Outputs are new contiguous
tensors (q and k often arrive as strided views of one fused QKV projection,
and the next ops want them dense). When the table is narrower than the head
(partial rotary), the remaining dims are copied through unchanged.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_rotary
from hydrant.kernels.triton_support import (
    check_triton_device,
    next_power_of_2,
    require_out,
    require_unit_stride,
)


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    stride_t,
    stride_h,
    num_heads,
    head_dim,
    cos,
    sin,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    h = tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < num_heads) & (i[None, :] < half)
    src = src_ptr + token * stride_t + h[:, None] * stride_h + i[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + token * (num_heads * head_dim) + h[:, None] * head_dim + i[None, :]
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=mask)
    tl.store(dst + half, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    q_out_ptr,
    k_out_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_cache,
    num_heads,
    num_kv_heads,
    head_dim,
    half,
    BLOCK_H: tl.constexpr,
    BLOCK_KH: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    row = cache_ptr + pos * stride_cache
    cos = tl.load(row + i, mask=i < half, other=0.0).to(tl.float32)
    sin = tl.load(row + half + i, mask=i < half, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        stride_qt,
        stride_qh,
        num_heads,
        head_dim,
        cos,
        sin,
        half,
        BLOCK_H,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        stride_kt,
        stride_kh,
        num_kv_heads,
        head_dim,
        cos,
        sin,
        half,
        BLOCK_KH,
        BLOCK_HALF,
    )


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the rotary kernel. Positions must be below `cos_sin_cache.shape[0]` (unchecked)."""
    check_rotary(positions, q, k, cos_sin_cache)
    check_triton_device(q.device)
    for name, tensor in (
        ("q", q),
        ("k", k),
        ("cos_sin_cache", cos_sin_cache),
        ("positions", positions),
    ):
        require_unit_stride(tensor, name)
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    rot = cos_sin_cache.shape[1]
    if q_out is None:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if k_out is None:
        k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    require_out(q_out, "q_out", tuple(q.shape), q.dtype, q.device)
    require_out(k_out, "k_out", tuple(k.shape), k.dtype, k.device)
    if rot < head_dim:
        q_out[..., rot:] = q[..., rot:]
        k_out[..., rot:] = k[..., rot:]
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            positions,
            q,
            k,
            cos_sin_cache,
            q_out,
            k_out,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            cos_sin_cache.stride(0),
            num_heads,
            num_kv_heads,
            head_dim,
            rot // 2,
            BLOCK_H=next_power_of_2(num_heads),
            BLOCK_KH=next_power_of_2(num_kv_heads),
            BLOCK_HALF=next_power_of_2(rot // 2),
            num_warps=4,
        )
    return q_out, k_out
