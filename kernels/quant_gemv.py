# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernels: weight-only dequantizing matrix-vector products for one-row decode.

At decode a linear layer reads every weight byte for a handful of activation
rows, so the only thing that matters is how close the weight read gets to the
memory bandwidth. The tiled `quant_matmul` kernels pad M to a 16-row `tl.dot`
and split K into float32 partials that two more launches sum and cast; on an
H200 that ran W4A16 at M=1 no faster than float16 cuBLAS (`bench/gpu_kernels.py`,
2026-12-04), although it reads a quarter of the bytes.

These kernels instead give each program `BLOCK_N` output channels of one
activation row and the whole of K: weights stream in `[BLOCK_N, BLOCK_K]`
tiles along contiguous rows, are dequantized in registers, and multiply-add
into a float32 accumulator of the tile's shape that is reduced once at the
end. There is no split and no second launch, and each output is summed in
one fixed order, so results are deterministic. Rows of a batch are separate
programs (grid axis 1): they re-read the weights, so from M=2 the tiled
kernel wins and only M=1 is sent here (`GEMV_MAX_M`).

W4A16 tiles cover whole quantization groups (`BLOCK_K` is a multiple of
`group_size`), loaded as `[BLOCK_N, groups, group_size // 2]` bytes so each
group's scale and zero point broadcast along the group without a gather.
Its known limit: the even and odd activations a byte's two nibbles meet are
loaded in another layout than the weight tile and move through shared memory
(four barriers a loop step in the sm_90 SASS), so W4A16 is bound by
instructions, not bandwidth (1.2-1.45x float16 where W8A16 reaches 1.5-1.8x).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_w4a16, check_w8a16, require
from hydrant.kernels.triton_support import check_triton_device, require_unit_stride


@dataclass(frozen=True)
class GemvConfig:
    """Launch shape: output channels per program, K per loop step, warps, pipeline depth."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    fast_convert: bool = True


# The best of the H200 sweep (`bench/gpu_kernels.py --tune`, 2026-12-04) at M=1 over the
# Llama-8B shapes: W8A16 1.5-1.8x float16 cuBLAS, W4A16 1.2-1.45x (the note has the table).
W8A16_GEMV = GemvConfig(block_n=8, block_k=512, num_warps=4, num_stages=3)
W4A16_GEMV = GemvConfig(block_n=16, block_k=512, num_warps=4, num_stages=3)
# At M=2 and 4 the rows re-read the weights and the tiled kernel won every shape there.
GEMV_MAX_M = 1


@triton.jit
def _int8_to_float(w, FAST: tl.constexpr):
    """int8 -> float32. `FAST` avoids the conversion instruction, which runs at a quarter
    of the float32 rate on Hopper and bound the first GEMV: adding v in [-128, 127] to the
    bits of 1.5 * 2**23 gives the float 1.5 * 2**23 + v exactly, then one subtraction."""
    if FAST:
        return (w.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
    else:
        return w.to(tl.float32)


@triton.jit
def _nibble_to_float(q, FAST: tl.constexpr):
    """A 4-bit code (int32, 0..15) -> float32, the same way: 2**23 + q, minus 2**23."""
    if FAST:
        return (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0
    else:
        return q.to(tl.float32)


@triton.jit
def _w8a16_gemv_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    out_ptr,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FAST_CONVERT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    x_row = x_ptr + row * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    # The next tile is loaded before this one is used, so two tiles are in flight per
    # program (the loads feed no tl.dot, so Triton does not pipeline them itself).
    rk = tl.arange(0, BLOCK_K)
    w_next = tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0)
    for k0 in range(0, K, BLOCK_K):
        w = w_next
        rk_next = k0 + BLOCK_K + tl.arange(0, BLOCK_K)
        w_next = tl.load(
            w_rows + rk_next[None, :], mask=n_mask[:, None] & (rk_next < K)[None, :], other=0
        )
        rk = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_row + rk, mask=rk < K, other=0.0).to(tl.float32)
        acc += _int8_to_float(w, FAST_CONVERT) * x[None, :]
    scale = tl.load(scales_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    out = tl.sum(acc, axis=1) * scale
    tl.store(out_ptr + row * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    N,
    num_groups,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_zn,
    stride_om,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP_BYTES: tl.constexpr,
    FAST_CONVERT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    g_offs = tl.arange(0, GROUPS)
    j = tl.arange(0, GROUP_BYTES)
    w_rows = w_ptr + rn.to(tl.int64)[:, None, None] * stride_wn
    x_row = x_ptr + row * stride_xm
    acc = tl.zeros([BLOCK_N, GROUPS, GROUP_BYTES], tl.float32)
    kb = g_offs[:, None] * GROUP_BYTES + j[None, :]  # byte offsets in a row: [GROUPS, GROUP_BYTES]
    packed_next = tl.load(
        w_rows + kb[None, :, :],
        mask=n_mask[:, None, None] & (g_offs < num_groups)[None, :, None],
        other=0,
    )
    for g0 in range(0, num_groups, GROUPS):
        packed = packed_next.to(tl.int32)
        g_next = g0 + GROUPS + g_offs
        kb_next = g_next[:, None] * GROUP_BYTES + j[None, :]
        packed_next = tl.load(  # prefetch, as in the W8A16 kernel
            w_rows + kb_next[None, :, :],
            mask=n_mask[:, None, None] & (g_next < num_groups)[None, :, None],
            other=0,
        )
        g = g0 + g_offs
        g_mask = g < num_groups
        kb = g[:, None] * GROUP_BYTES + j[None, :]
        # Low nibbles hold even columns of K, high nibbles odd ones (int4_layout).
        x_even = tl.load(x_row + 2 * kb, mask=g_mask[:, None], other=0.0).to(tl.float32)
        x_odd = tl.load(x_row + 2 * kb + 1, mask=g_mask[:, None], other=0.0).to(tl.float32)
        sz_mask = n_mask[:, None] & g_mask[None, :]
        scale = tl.load(scales_ptr + rn[:, None] * stride_sn + g[None, :], mask=sz_mask, other=0.0)
        zero = tl.load(zeros_ptr + rn[:, None] * stride_zn + g[None, :], mask=sz_mask, other=0)
        scale3 = scale.to(tl.float32)[:, :, None]
        # (q - z) * s as q * s - z * s: one multiply-add per code after the conversion.
        zero_scaled3 = zero.to(tl.float32)[:, :, None] * scale3
        lo = _nibble_to_float(packed & 0xF, FAST_CONVERT) * scale3 - zero_scaled3
        hi = _nibble_to_float(packed >> 4, FAST_CONVERT) * scale3 - zero_scaled3
        acc += lo * x_even[None, :, :] + hi * x_odd[None, :, :]
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + row * stride_om + rn, out.to(out_ptr.dtype.element_ty), mask=n_mask)


def check_w8a16_launch(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> None:
    """What both W8A16 launchers (this GEMV, the tiled kernel) need of their arguments."""
    check_w8a16(x, qweight, scales)
    check_triton_device(x.device)
    require_unit_stride(x, "x")
    require_unit_stride(qweight, "qweight")
    require(scales.is_contiguous(), "scales must be contiguous")


def check_w4a16_launch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int,
    min_group_size: int,
) -> None:
    """What both W4A16 launchers need; the tiled kernel's K tiles need groups of >= 32."""
    check_w4a16(x, qweight, scales, zeros, group_size)
    check_triton_device(x.device)
    require_unit_stride(x, "x")
    for name, tensor in (("qweight", qweight), ("scales", scales), ("zeros", zeros)):
        require_unit_stride(tensor, name)
    require(
        group_size >= min_group_size and group_size & (group_size - 1) == 0,
        f"the W4A16 kernel needs a power-of-2 group_size >= {min_group_size}, got {group_size}",
    )


def _check_config(config: GemvConfig) -> None:
    for name in ("block_n", "block_k"):
        value = getattr(config, name)
        require(value >= 1 and value & (value - 1) == 0, f"{name} must be a power of 2: {value}")


def w8a16_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    *,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """`x @ (qweight * scales[:, None]).T` for a few rows of `x` (decode)."""
    config = config or W8A16_GEMV
    check_w8a16_launch(x, qweight, scales)
    _check_config(config)
    (m, k), n = x.shape, qweight.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        _w8a16_gemv_kernel[(triton.cdiv(n, config.block_n), m)](
            x,
            qweight,
            scales,
            out,
            n,
            k,
            x.stride(0),
            qweight.stride(0),
            out.stride(0),
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            FAST_CONVERT=config.fast_convert,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out


def w4a16_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    *,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """`x @ dequant(qweight, scales, zeros).T` for a few rows of `x` (decode)."""
    config = config or W4A16_GEMV
    check_w4a16_launch(x, qweight, scales, zeros, group_size, min_group_size=2)
    _check_config(config)
    (m, k), n = x.shape, qweight.shape[0]
    groups = max(1, config.block_k // group_size)  # a tile holds whole groups
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m and n:
        _w4a16_gemv_kernel[(triton.cdiv(n, config.block_n), m)](
            x,
            qweight,
            scales,
            zeros,
            out,
            n,
            k // group_size,
            x.stride(0),
            qweight.stride(0),
            scales.stride(0),
            zeros.stride(0),
            out.stride(0),
            BLOCK_N=config.block_n,
            GROUPS=groups,
            GROUP_BYTES=group_size // 2,
            FAST_CONVERT=config.fast_convert,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    return out
