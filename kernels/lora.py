# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernels: Punica's SGMV and BGMV, the LoRA deltas of a batch that mixes adapters.

Every targeted linear of a step adds `scale[s] * (x @ A[s].T) @ B[s].T` to its output,
where `s` is the adapter slot of each row (-1: the base model, untouched). The adapters
of all slots are stacked (`A [slots, R, K]`, `B [slots, N, R]`, ranks padded to R with
zeros), so one launch serves every adapter in the batch instead of one matmul per
adapter (Punica, arXiv:2310.18547):

- BGMV (decode rows, one token per sequence): a program per row gathers its slot's A
  and B; matrix-vector products, as the rows' adapters all differ.
- SGMV (prefill chunks): rows come in segments of one slot (a sequence's chunk), so a
  program takes a tile of a segment's rows and runs real matmuls against that slot's A
  and B.

Both are two launches, "shrink" (`x @ A.T` into a float32 `[T, R]` buffer) and "expand"
(`@ B.T`, scaled, added to `y` in place), as Punica and S-LoRA split them: the expand's
output tiles then do not each redo the shrink. Accumulation is float32, rounded once
into `y`'s dtype. `y` may be a column slice of a fused projection's output (its rows
strided); every last dimension must be contiguous.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_lora_bgmv, check_lora_sgmv
from hydrant.kernels.triton_support import (
    check_triton_device,
    dot_dtype,
    dot_precision,
    next_power_of_2,
    require_unit_stride,
)

BLOCK_M = 16  # rows of a segment per SGMV program (tl.dot's smallest tile)
BLOCK_N = 64  # output columns per expand program
BLOCK_K = 64  # input columns per shrink iteration


@triton.jit
def _bgmv_shrink_kernel(
    x_ptr, a_ptr, slots_ptr, mid_ptr, K, R, stride_xt, stride_as, stride_ar,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    rr = tl.arange(0, BLOCK_R)
    r_mask = rr < R
    a_rows = a_ptr + slot * stride_as + rr[:, None].to(tl.int64) * stride_ar
    acc = tl.zeros([BLOCK_R], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        xv = tl.load(x_ptr + t * stride_xt + rk, mask=k_mask, other=0.0).to(tl.float32)
        a = tl.load(a_rows + rk[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(a.to(tl.float32) * xv[None, :], axis=1)
    tl.store(mid_ptr + t * BLOCK_R + rr, acc)


@triton.jit
def _bgmv_expand_kernel(
    mid_ptr, b_ptr, scales_ptr, slots_ptr, y_ptr, N, R, stride_yt, stride_bs, stride_bn,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    rr = tl.arange(0, BLOCK_R)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    mid = tl.load(mid_ptr + t * BLOCK_R + rr)
    b = tl.load(
        b_ptr + slot * stride_bs + rn[:, None].to(tl.int64) * stride_bn + rr[None, :],
        mask=n_mask[:, None] & (rr[None, :] < R),
        other=0.0,
    )
    delta = tl.sum(b.to(tl.float32) * mid[None, :], axis=1) * tl.load(scales_ptr + slot)
    out = y_ptr + t * stride_yt + rn
    y = tl.load(out, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out, (y + delta).to(y_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _sgmv_shrink_kernel(
    x_ptr, a_ptr, starts_ptr, seg_slots_ptr, mid_ptr, K, R, stride_xt, stride_as, stride_ar,
    BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
    COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    slot = tl.load(seg_slots_ptr + g).to(tl.int64)
    first = tl.load(starts_ptr + g).to(tl.int64) + tl.program_id(1) * BLOCK_M
    end = tl.load(starts_ptr + g + 1).to(tl.int64)
    if slot < 0 or first >= end:
        return
    rm = first + tl.arange(0, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)
    m_mask, r_mask = rm < end, rr < R
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < K
        x = tl.load(
            x_ptr + rm[:, None] * stride_xt + rk[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        a = tl.load(
            a_ptr + slot * stride_as + rr[None, :].to(tl.int64) * stride_ar + rk[:, None],
            mask=k_mask[:, None] & r_mask[None, :],
            other=0.0,
        )
        acc += tl.dot(x.to(COMPUTE), a.to(COMPUTE), input_precision=PRECISION)
    tl.store(mid_ptr + rm[:, None] * BLOCK_R + rr[None, :], acc, mask=m_mask[:, None])


@triton.jit
def _sgmv_expand_kernel(
    mid_ptr, b_ptr, scales_ptr, starts_ptr, seg_slots_ptr, y_ptr, N, R, stride_yt, stride_bs,
    stride_bn, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    g = tl.program_id(0)
    slot = tl.load(seg_slots_ptr + g).to(tl.int64)
    first = tl.load(starts_ptr + g).to(tl.int64) + tl.program_id(1) * BLOCK_M
    end = tl.load(starts_ptr + g + 1).to(tl.int64)
    if slot < 0 or first >= end:
        return
    rm = first + tl.arange(0, BLOCK_M)
    rr = tl.arange(0, BLOCK_R)
    rn = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rm < end, rn < N
    mid = tl.load(mid_ptr + rm[:, None] * BLOCK_R + rr[None, :], mask=m_mask[:, None], other=0.0)
    b = tl.load(
        b_ptr + slot * stride_bs + rn[None, :].to(tl.int64) * stride_bn + rr[:, None],
        mask=(rr[:, None] < R) & n_mask[None, :],
        other=0.0,
    )
    delta = tl.dot(mid.to(COMPUTE), b.to(COMPUTE), input_precision=PRECISION)
    delta = delta * tl.load(scales_ptr + slot)
    out = y_ptr + rm[:, None] * stride_yt + rn[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    y = tl.load(out, mask=mask, other=0.0).to(tl.float32)
    tl.store(out, (y + delta).to(y_ptr.dtype.element_ty), mask=mask)


def _check_strides(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    check_triton_device(x.device)
    for name, tensor in (("y", y), ("x", x), ("lora_a", a), ("lora_b", b)):
        require_unit_stride(tensor, name)


def lora_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    """`y[t] += scales[s] * (x[t] @ lora_a[s].T) @ lora_b[s].T`, `s = token_slots[t]` (-1: skip)."""
    check_lora_bgmv(y, x, lora_a, lora_b, scales, token_slots)
    _check_strides(y, x, lora_a, lora_b)
    rows, (_, rank, k), n = x.shape[0], lora_a.shape, y.shape[1]
    if rows == 0 or n == 0:
        return
    block_r = next_power_of_2(rank)
    mid = torch.empty((rows, block_r), dtype=torch.float32, device=x.device)
    _bgmv_shrink_kernel[(rows,)](
        x, lora_a, token_slots, mid, k, rank, x.stride(0), lora_a.stride(0), lora_a.stride(1),
        BLOCK_R=block_r, BLOCK_K=min(BLOCK_K, next_power_of_2(k)),
    )  # fmt: skip
    block_n = min(BLOCK_N, next_power_of_2(n))
    _bgmv_expand_kernel[(rows, triton.cdiv(n, block_n))](
        mid, lora_b, scales, token_slots, y, n, rank, y.stride(0), lora_b.stride(0),
        lora_b.stride(1), BLOCK_R=block_r, BLOCK_N=block_n,
    )  # fmt: skip


def lora_sgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int | None = None,
) -> None:
    """Rows `seg_starts[g]:seg_starts[g + 1]` add their segment's adapter (slot -1: skip).

    `max_seg_len` (the longest segment) sizes the grid; without it it is read from
    `seg_starts`, a device-to-host copy the engine avoids by passing it.
    """
    check_lora_sgmv(y, x, lora_a, lora_b, scales, seg_starts, seg_slots)
    _check_strides(y, x, lora_a, lora_b)
    segments, (_, rank, k), n = seg_slots.shape[0], lora_a.shape, y.shape[1]
    if max_seg_len is None:
        max_seg_len = int((seg_starts[1:] - seg_starts[:-1]).max()) if segments else 0
    if segments == 0 or max_seg_len <= 0 or n == 0:
        return
    block_r = max(16, next_power_of_2(rank))
    compute, precision = dot_dtype(x.dtype), dot_precision(x.dtype)
    mid = torch.empty((x.shape[0], block_r), dtype=torch.float32, device=x.device)
    tiles = triton.cdiv(max_seg_len, BLOCK_M)
    _sgmv_shrink_kernel[(segments, tiles)](
        x, lora_a, seg_starts, seg_slots, mid, k, rank, x.stride(0), lora_a.stride(0),
        lora_a.stride(1), BLOCK_M=BLOCK_M, BLOCK_R=block_r,
        BLOCK_K=max(16, min(BLOCK_K, next_power_of_2(k))), COMPUTE=compute, PRECISION=precision,
    )  # fmt: skip
    block_n = max(16, min(BLOCK_N, next_power_of_2(n)))
    _sgmv_expand_kernel[(segments, tiles, triton.cdiv(n, block_n))](
        mid, lora_b, scales, seg_starts, seg_slots, y, n, rank, y.stride(0), lora_b.stride(0),
        lora_b.stride(1), BLOCK_M=BLOCK_M, BLOCK_R=block_r, BLOCK_N=block_n, COMPUTE=compute,
        PRECISION=precision,
    )  # fmt: skip
