# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: write new tokens' K/V into the paged cache by slot mapping.

One program per token writes all its KV heads (one contiguous run of
`num_kv_heads * head_dim` elements in the cache), so the store is coalesced.
Slot -1 marks padding (e.g. CUDA-graph batch padding) and is skipped. For an
int8 cache the kernel quantizes on the fly, symmetric per token per head,
exactly as `reference.quantize_kv_int8`: `scale = amax / 127`,
`q = floor(x / scale + 0.5)` with IEEE division so both agree bit for bit.
Two tokens mapped to one slot is a caller bug; which one wins is undefined.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_write_kv
from hydrant.kernels.triton_support import (
    check_triton_device,
    next_power_of_2,
    require_contiguous,
    require_unit_stride,
)


@triton.jit
def _store_one(
    src_ptr,
    stride_t,
    stride_h,
    cache_ptr,
    scale_ptr,
    token,
    slot,
    num_kv_heads,
    head_dim,
    QUANTIZED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    # The scalar `slot >= 0` is broadcast through a vector: the interpreter rejects
    # masks built from scalar booleans.
    head_mask = (heads < num_kv_heads) & ((heads * 0 + slot) >= 0)
    mask = head_mask[:, None] & (dims[None, :] < head_dim)
    src = src_ptr + token * stride_t + heads[:, None] * stride_h + dims[None, :]
    x = tl.load(src, mask=mask, other=0.0)
    dst = cache_ptr + slot * (num_kv_heads * head_dim) + heads[:, None] * head_dim + dims[None, :]
    if QUANTIZED:
        xf = x.to(tl.float32)
        scale = tl.math.div_rn(tl.max(tl.abs(xf), axis=1), 127.0)
        safe = tl.where(scale > 0.0, scale, 1.0)
        codes = tl.floor(tl.math.div_rn(xf, safe[:, None]) + 0.5)
        codes = tl.minimum(tl.maximum(codes, -127.0), 127.0)
        tl.store(dst, codes.to(tl.int8), mask=mask)
        tl.store(scale_ptr + slot * num_kv_heads + heads, scale, mask=head_mask)
    else:
        tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scale_ptr,
    v_scale_ptr,
    slot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    num_kv_heads,
    head_dim,
    QUANTIZED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    _store_one(
        key_ptr,
        stride_kt,
        stride_kh,
        k_cache_ptr,
        k_scale_ptr,
        token,
        slot,
        num_kv_heads,
        head_dim,
        QUANTIZED,
        BLOCK_H,
        BLOCK_D,
    )
    _store_one(
        value_ptr,
        stride_vt,
        stride_vh,
        v_cache_ptr,
        v_scale_ptr,
        token,
        slot,
        num_kv_heads,
        head_dim,
        QUANTIZED,
        BLOCK_H,
        BLOCK_D,
    )


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Launch `_write_kv_kernel`; see `hydrant.kernels.ops.write_kv` for the contract."""
    quantized = check_write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    check_triton_device(key.device)
    require_unit_stride(key, "key")
    require_unit_stride(value, "value")
    require_contiguous(k_cache, "k_cache")
    require_contiguous(v_cache, "v_cache")
    require_contiguous(slot_mapping, "slot_mapping")
    if k_scale is not None and v_scale is not None:
        require_contiguous(k_scale, "k_scale")
        require_contiguous(v_scale, "v_scale")
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    # Unused scale pointers still need a tensor argument; the constexpr branch never reads them.
    dummy = slot_mapping
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        k_scale if k_scale is not None else dummy,
        v_scale if v_scale is not None else dummy,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        num_kv_heads,
        head_dim,
        QUANTIZED=quantized,
        BLOCK_H=next_power_of_2(num_kv_heads),
        BLOCK_D=next_power_of_2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )
