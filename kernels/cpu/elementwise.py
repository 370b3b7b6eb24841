"""The `cpu` backend's elementwise ops: RMSNorm, SiLU-and-mul and RoPE in PyTorch.

They carry the table's signatures (`hydrant.kernels.table`). The arithmetic
follows transformers' Llama code operation by operation (RMSNorm in float32
then rounded to the input dtype before the gain, RoPE as
`x*cos + rotate_half(x)*sin` in the activation dtype), because the engine's
tests hold it to transformers' logits at 1e-4; `hydrant.kernels.reference`
instead computes everything in float32 and rounds once, as the Triton kernels
do. In float32 the two agree to rounding. No argument checks: the engine
calls these with shapes it built itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of `x + residual`; returns (normed, the sum) so the caller keeps the stream."""
    if residual is not None:
        x = x + residual
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance.add_(eps))  # a new tensor: never x itself
    if input_dtype == torch.float32:
        return h.mul_(weight), x  # float products commute: the same bits as weight * h
    return weight * h.to(input_dtype), x


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused [gate | up] projection: silu(gate) * up."""
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]).mul_(x[..., half:])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return torch.cat((x1 * cos + (-x2) * sin, x2 * cos + x1 * sin), dim=-1)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE of q [T, H, D] and k [T, Hkv, D] at the given positions."""
    rows = cos_sin_cache.index_select(0, positions).to(q.dtype)
    half = rows.shape[-1] // 2
    cos = rows[:, None, :half]
    sin = rows[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)
