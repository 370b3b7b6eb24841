# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: RMSNorm, optionally fused with the residual add that precedes it.

In a Llama block every norm after the first reads `x + residual` and the
next block needs that sum again, so the fused kernel reads both once, writes
the sum (rounded to the activation dtype, as an unfused model would hold it)
and normalises that rounded sum in float32. One program per row; the whole
hidden vector fits one block (hidden <= 16384 in the models we serve).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_rms_norm, require
from hydrant.kernels.triton_support import (
    check_triton_device,
    next_power_of_2,
    require_contiguous,
    require_out,
)

MAX_HIDDEN = 16384


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    new_residual_ptr,
    stride_x,
    stride_r,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * hidden + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / hidden
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * hidden + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch RMSNorm; returns `(normed, x + residual)`, or `(normed, x)` without a residual."""
    check_rms_norm(x, weight, residual)
    check_triton_device(x.device)
    hidden = x.shape[-1]
    require(hidden <= MAX_HIDDEN, f"hidden size {hidden} exceeds the kernel's {MAX_HIDDEN}")
    require_contiguous(weight, "weight")
    x2 = x.reshape(-1, hidden)
    require(x2.shape[0] == 0 or hidden <= 1 or x2.stride(1) == 1, "x must be contiguous in hidden")
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    require_out(out, "out", tuple(x.shape), x.dtype, x.device)
    r2 = x2
    if residual is not None:
        r2 = residual.reshape(-1, hidden)
        require(hidden <= 1 or r2.stride(1) == 1, "residual must be contiguous in hidden")
        if residual_out is None:
            residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        require_out(residual_out, "residual_out", tuple(x.shape), x.dtype, x.device)
    rows = x2.shape[0]
    if rows:
        block = next_power_of_2(hidden)
        _rms_norm_kernel[(rows,)](
            x2,
            r2,
            weight,
            out,
            residual_out if residual_out is not None else out,
            x2.stride(0),
            r2.stride(0),
            hidden,
            float(eps),
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(16, max(1, block // 512)),
        )
    return out, (residual_out if residual is not None and residual_out is not None else x)
