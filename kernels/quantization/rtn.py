"""Round-to-nearest weight quantizers for the W8A16 and W4A16 layouts.

INT8 is symmetric per output channel (`scale = amax / 127`): weights are
roughly zero-centred per row, and one scale per row lets the kernel apply it
once to the accumulator. INT4 is asymmetric per group of `group_size` input
columns (`scale = (max - min) / 15`, integer zero point): with only 16 levels,
using the group's actual range instead of a symmetric one buys about one bit.
Both compute in float32 and return scales (and zeros) in `scale_dtype`.
A fp16 scale can underflow for all-tiny rows; such a row then dequantizes to 0.
"""

from __future__ import annotations

import torch

from hydrant.kernels.arguments import check_rank, require
from hydrant.kernels.int4_layout import pack_int4

INT8_MAX = 127.0
INT4_MAX = 15.0


def _as_stored(scales: torch.Tensor, scale_dtype: torch.dtype) -> torch.Tensor:
    """Round scales to their stored dtype first: codes are chosen for the scale the kernel sees."""
    return scales.to(scale_dtype).to(torch.float32)


def quantize_int8_per_channel(
    weight: torch.Tensor, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(qweight int8 [N, K], scales [N])` with `weight ≈ qweight * scales[:, None]`."""
    check_rank(weight, "weight", 2, "[N, K]")
    w = weight.detach().to(torch.float32)
    scales = _as_stored(w.abs().amax(dim=1) / INT8_MAX, scale_dtype)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(w / safe[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scales.to(scale_dtype)


def quantize_int4_groupwise(
    weight: torch.Tensor, group_size: int, scale_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(qweight uint8 [N, K//2], scales [N, G], zeros [N, G])`, G = K // group_size."""
    check_rank(weight, "weight", 2, "[N, K]")
    n, k = weight.shape
    require(
        group_size > 0 and group_size % 2 == 0 and k % group_size == 0,
        f"group_size {group_size} must be even and divide in_features {k}",
    )
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    w_min = w.amin(dim=-1)
    w_max = w.amax(dim=-1)
    scales = _as_stored((w_max - w_min) / INT4_MAX, scale_dtype)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.round(-w_min / safe).clamp_(0, INT4_MAX)
    codes = torch.round(w / safe[..., None] + zeros[..., None]).clamp_(0, INT4_MAX)
    packed = pack_int4(codes.reshape(n, k).to(torch.uint8))
    return packed, safe.to(scale_dtype), zeros.to(scale_dtype)
