"""The cos/sin table that `rotary_embedding` reads, including Llama 3 frequency scaling.

Row `p` of the table is `cat(cos(p * inv_freq), sin(p * inv_freq))`, so a
kernel fetches one contiguous row per token. It is computed in float32 and
rounded once to `dtype`, matching transformers, whose cos/sin are float32
products cast to the activation dtype. Scaling types are those of the Llama
family's configs ("default", "linear", "llama3"); types whose table depends
on the running sequence length (dynamic NTK, YaRN's attention factor) are
refused rather than approximated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from hydrant.kernels.errors import KernelArgumentError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def _rope_type(rope_scaling: Mapping[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise KernelArgumentError(
            f"rope scaling type {kind!r} is not supported; expected one of "
            f"{', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    return str(kind)


def _scaling_value(rope_scaling: Mapping[str, Any], key: str) -> float:
    if key not in rope_scaling:
        raise KernelArgumentError(f"rope_scaling is missing {key!r}: {dict(rope_scaling)}")
    return float(rope_scaling[key])


def llama3_inv_freq(inv_freq: torch.Tensor, rope_scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a ramp between."""
    factor = _scaling_value(rope_scaling, "factor")
    low_freq_factor = _scaling_value(rope_scaling, "low_freq_factor")
    high_freq_factor = _scaling_value(rope_scaling, "high_freq_factor")
    old_context = _scaling_value(rope_scaling, "original_max_position_embeddings")
    if high_freq_factor == low_freq_factor:
        raise KernelArgumentError("llama3 rope scaling needs high_freq_factor != low_freq_factor")
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_inv_freq(
    head_dim: int, rope_theta: float, rope_scaling: Mapping[str, Any] | None
) -> torch.Tensor:
    """Float32 inverse frequencies `[head_dim // 2]` after the configured scaling."""
    if head_dim <= 0 or head_dim % 2:
        raise KernelArgumentError(f"rotary head_dim must be a positive even number, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (float(rope_theta) ** exponents)
    kind = _rope_type(rope_scaling)
    scaling: Mapping[str, Any] = rope_scaling or {}
    if kind == "linear":
        inv_freq = inv_freq / _scaling_value(scaling, "factor")
    elif kind == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def build_rope_cache(
    head_dim: int,
    max_position: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None,
    dtype: torch.dtype,
    device: torch.device | str,
) -> torch.Tensor:
    """`[max_position, head_dim]` table of `cat(cos, sin)` rows for `rotary_embedding`.

    `head_dim` is the rotated width: pass `int(head_dim * partial_rotary_factor)`
    for models that rotate only part of each head.
    """
    if max_position <= 0:
        raise KernelArgumentError(f"max_position must be positive, got {max_position}")
    inv_freq = rope_inv_freq(head_dim, rope_theta, rope_scaling)
    positions = torch.arange(max_position, dtype=torch.int64).to(torch.float32)
    freqs = torch.outer(positions, inv_freq)
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    return table.to(dtype=dtype, device=device)
