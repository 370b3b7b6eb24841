# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernels: weight-only dequantizing matmuls, W8A16 and W4A16.

`out[M, N] = x[M, K] @ dequant(W)[N, K].T` with 16-bit (or float32)
activations and int8 / packed-int4 weights. Weights are dequantized in
registers tile by tile and never exist in float in memory: at decode (M of
1-8) the matmul is bound by reading weights, so 4-bit weights read 4x fewer
bytes than float16 ones. Those small-M launches have few output tiles, so K
is split across programs (`SPLIT_K`) and float32 partials are summed after,
which fills the GPU without atomics and stays deterministic.

W8A16: per-output-channel scales, applied once to the float32 accumulator.
W4A16: layout in `hydrant.kernels.int4_layout`. A K tile never straddles a
quantization group (`BLOCK_K` divides `group_size`), so each tile uses one
scale and zero point per output column: the kernel accumulates
`x_even @ (lo - z) + x_odd @ (hi - z)` and scales that by the group's scale
(low nibbles are even columns of K, high nibbles odd columns).

The block sizes come from `matmul_config.matmul_config`, a heuristic by M; they are not
autotuned yet (that needs GPU time), and `bench/gpu_kernels.py` measures them. Batches of
at most `quant_gemv.GEMV_MAX_M` rows go to the matrix-vector kernels of `quant_gemv`
instead (on an H200 at M=1 they beat this kernel by 1.3-1.8x).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels import quant_gemv
from hydrant.kernels.arguments import require
from hydrant.kernels.matmul_config import MatmulConfig, finish, grid, matmul_config, output
from hydrant.kernels.quant_gemv import (
    check_w4a16_launch,
    check_w8a16_launch,
    w4a16_gemv,
    w8a16_gemv,
)
from hydrant.kernels.triton_support import dot_dtype, dot_precision


@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    k_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rm < M, rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    for k0 in range(k_start, k_end, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_mask = rk < k_end
        x = tl.load(
            x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + rn[None, :].to(tl.int64) * stride_wn + rk[:, None],
            mask=k_mask[:, None] & n_mask[None, :],
            other=0,
        )
        acc += tl.dot(x.to(COMPUTE), w.to(COMPUTE), input_precision=PRECISION)
    scale = tl.load(scales_ptr + rn, mask=n_mask, other=0.0).to(tl.float32)
    acc = acc * scale[None, :]
    out = out_ptr + pid_k * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _w4a16_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_zn,
    k_per_split,
    group_size,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = rm < M, rn < N
    BLOCK_KB: tl.constexpr = BLOCK_K // 2
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # The loop runs over packed bytes (not K) so the weight offsets stay provably
    # 16-aligned and the loads vectorize; a `k // 2` would hide the alignment.
    kb_per_split = k_per_split // 2
    kb_start = pid_k * kb_per_split
    kb_end = tl.minimum(K // 2, kb_start + kb_per_split)
    for kb0 in range(kb_start, kb_end, BLOCK_KB):
        kb = kb0 + tl.arange(0, BLOCK_KB)
        kb_mask = kb < kb_end
        k = kb0 * 2 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_rows + k[None, :], mask=m_mask[:, None] & (k[None, :] < 2 * kb_end), other=0.0
        )
        x_even, x_odd = tl.split(tl.reshape(x, [BLOCK_M, BLOCK_KB, 2]))
        x_even = x_even.to(COMPUTE)
        x_odd = x_odd.to(COMPUTE)
        packed = tl.load(
            w_ptr + rn[None, :].to(tl.int64) * stride_wn + kb[:, None],
            mask=kb_mask[:, None] & n_mask[None, :],
            other=0,
        )
        k0 = kb0 * 2
        group = k0 // group_size
        scale = tl.load(scales_ptr + rn * stride_sn + group, mask=n_mask, other=0.0)
        zero = tl.load(zeros_ptr + rn * stride_zn + group, mask=n_mask, other=0).to(tl.float32)
        lo = ((packed & 0xF).to(tl.float32) - zero[None, :]).to(COMPUTE)
        hi = ((packed >> 4).to(tl.float32) - zero[None, :]).to(COMPUTE)
        part = tl.dot(x_even, lo, input_precision=PRECISION)
        part = tl.dot(x_odd, hi, acc=part, input_precision=PRECISION)
        acc += part * scale.to(tl.float32)[None, :]
    out = out_ptr + pid_k * M * N + rm[:, None].to(tl.int64) * N + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def _k_per_split(k: int, config: MatmulConfig) -> int:
    """The K range of one split, a whole number of K tiles."""
    return int(triton.cdiv(triton.cdiv(k, config.split_k), config.block_k) * config.block_k)


def _launch_options(config: MatmulConfig, dtype: torch.dtype) -> dict[str, object]:
    """Tile sizes, dot precision and launch shape shared by both weight-only kernels."""
    return {
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "COMPUTE": dot_dtype(dtype),
        "PRECISION": dot_precision(dtype),
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }


def w8a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    *,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """`x @ (qweight * scales[:, None]).T`; `config` overrides the tile heuristic (tests).

    Decode-sized batches (M up to `GEMV_MAX_M`) go to the matrix-vector kernel unless a
    config asks for the tiled one.
    """
    if config is None and x.dim() == 2 and x.shape[0] <= quant_gemv.GEMV_MAX_M:
        return w8a16_gemv(x, qweight, scales)
    check_w8a16_launch(x, qweight, scales)
    (m, k), n = x.shape, qweight.shape[0]
    config = config or matmul_config(m, n, k, x.device, max_block_k=128)
    target = output(x, n, config)
    if m and n:
        k_per_split = _k_per_split(k, config)
        _w8a16_kernel[grid(m, n, config)](
            x,
            qweight,
            scales,
            target,
            m,
            n,
            k,
            x.stride(0),
            qweight.stride(0),
            k_per_split,
            **_launch_options(config, x.dtype),
        )
    elif config.split_k > 1:
        target.zero_()
    return finish(target, x, config)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    *,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """`x @ dequant(qweight, scales, zeros).T`; layout and zero-point rule in `int4_layout`.

    Decode-sized batches go to the matrix-vector kernel, as in `w8a16_matmul`.
    """
    if config is None and x.dim() == 2 and x.shape[0] <= quant_gemv.GEMV_MAX_M:
        return w4a16_gemv(x, qweight, scales, zeros, group_size)
    check_w4a16_launch(x, qweight, scales, zeros, group_size, min_group_size=32)
    (m, k), n = x.shape, qweight.shape[0]
    config = config or matmul_config(m, n, k, x.device, max_block_k=min(128, group_size))
    require(
        group_size % config.block_k == 0 and config.block_k >= 32,
        f"block_k {config.block_k} must be >= 32 and divide group_size {group_size}",
    )
    target = output(x, n, config)
    if m and n:
        k_per_split = _k_per_split(k, config)
        _w4a16_kernel[grid(m, n, config)](
            x,
            qweight,
            scales,
            zeros,
            target,
            m,
            n,
            k,
            x.stride(0),
            qweight.stride(0),
            scales.stride(0),
            zeros.stride(0),
            k_per_split,
            group_size,
            **_launch_options(config, x.dtype),
        )
    elif config.split_k > 1:
        target.zero_()
    return finish(target, x, config)
