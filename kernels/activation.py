# mypy: disable-error-code="no-untyped-def"
# (Triton reads parameter annotations as kernel types, so @triton.jit signatures stay bare.)
"""Triton kernel: SiLU-and-mul, the gated activation of Llama's MLP.

Input rows are `cat(gate, up)` (the fused gate/up projection's output); the
kernel computes `silu(gate) * up` in float32 and rounds once, so the
intermediate `silu(gate)` never round-trips through memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hydrant.kernels.arguments import check_silu_and_mul, require
from hydrant.kernels.triton_support import check_triton_device, require_out

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, inter, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * inter + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Launch SiLU-and-mul: `[..., 2I] -> [..., I]`, gate first half, up second."""
    check_silu_and_mul(x)
    check_triton_device(x.device)
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    require(x2.shape[0] == 0 or x2.stride(1) == 1, "x must be contiguous in its last dimension")
    shape = (*x.shape[:-1], inter)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    require_out(out, "out", shape, x.dtype, x.device)
    rows = x2.shape[0]
    if rows and inter:
        block = min(BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            x2,
            out,
            x2.stride(0),
            inter,
            BLOCK=block,
            num_warps=4,
        )
    return out
