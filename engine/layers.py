"""Pure-PyTorch versions of the model's elementwise ops.

These carry the same signatures as the Triton kernels of `hydrant.kernels`, so
the model can switch to them with an import change. The arithmetic follows
transformers' Llama code operation by operation (RMSNorm in float32, RoPE as
`x*cos + rotate_half(x)*sin`), because the tests hold us to its logits at 1e-4.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from hydrant.engine.errors import UnsupportedModelError


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


def _inv_freq(
    head_dim: int, rope_theta: float, rope_scaling: dict[str, Any] | None
) -> torch.Tensor:
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope_theta**exponents)
    if rope_scaling is None:
        return inv_freq
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"])
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)
    raise UnsupportedModelError(f"rope type {rope_type!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent interpolation (long wavelengths slowed by `factor`)."""
    factor = float(scaling["factor"])
    low_freq_factor = float(scaling["low_freq_factor"])
    high_freq_factor = float(scaling["high_freq_factor"])
    old_context_len = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def build_rope_cache(
    head_dim: int,
    max_position: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """Rows `cat(cos, sin)` of each position's D/2 frequencies, computed in float32."""
    inv_freq = _inv_freq(head_dim, rope_theta, rope_scaling)
    positions = torch.arange(max_position, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return cache.to(dtype=dtype, device=device)


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
