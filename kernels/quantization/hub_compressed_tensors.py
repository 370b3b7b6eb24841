"""compressed-tensors `pack-quantized` checkpoints (llm-compressor's W4A16 / W8A16) to Hydrant.

Per quantized linear (`weight` `[N, K]` in the float model), the
`PackedQuantizationCompressor` of the `compressed-tensors` library stores:

- `weight_packed` int32 `[N, ceil(K * bits / 32)]`: codes packed densely along K,
  sequential; each code is the signed value plus `2 ** (bits - 1)` (so 4-bit
  codes are 0..15 for values -8..7, 8-bit codes 0..255 for -128..127);
- `weight_scale` `[N, K // G]` (strategy "group") or `[N, 1]` ("channel");
- `weight_zero_point`, asymmetric only: signed zero points `[N, K // G]`
  packed the same way but along N (dim 0), `[ceil(N * bits / 32), K // G]`;
- `weight_shape` int64 `[2]`: `(N, K)`.

and `w = (value - zero_point) * scale`. In unsigned code space both sides
shift by `2 ** (bits - 1)`: `w = (code - (zero_point + 8)) * scale` for 4 bits,
Hydrant's W4A16 rule with `z = zero_point + 8` (8 when symmetric). An 8-bit
symmetric per-channel weight is Hydrant's W8A16 as it is (`value = code - 128`).
"""

from __future__ import annotations

import torch

from hydrant.kernels.arguments import check_dtype, check_rank, require
from hydrant.kernels.quantization.hub_repack import (
    RepackedWeight,
    int4_from_codes,
    int8_from_codes,
)
from hydrant.kernels.quantization.int32_packing import unpack_int32

PACKED_TENSORS = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")


def repack_pack_quantized(
    weight_packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_shape: torch.Tensor,
    weight_zero_point: torch.Tensor | None,
    num_bits: int,
) -> RepackedWeight:
    """One pack-quantized linear: 4 bits -> int4 (group or channel), 8 bits -> int8.

    The strategy is read from the scale's shape (`[N, 1]` is per channel). An
    8-bit weight must be symmetric per channel: W8A16 has no groups or zeros.
    """
    check_dtype(weight_packed, "weight_packed", (torch.int32,))
    check_rank(weight_packed, "weight_packed", 2, "[N, packed K]")
    check_rank(weight_scale, "weight_scale", 2, "[N, groups]")
    require(num_bits in (4, 8), f"num_bits must be 4 or 8, got {num_bits}")
    require(weight_shape.numel() == 2, f"weight_shape must be (N, K), got {weight_shape.tolist()}")
    n, k = (int(v) for v in weight_shape.tolist())
    require(
        weight_packed.shape[0] == n and weight_scale.shape[0] == n,
        f"weight_packed / weight_scale must have N={n} rows, got "
        f"{list(weight_packed.shape)} / {list(weight_scale.shape)}",
    )
    offset = 1 << (num_bits - 1)
    codes = unpack_int32(weight_packed, num_bits, dim=1)
    require(codes.shape[1] >= k, f"weight_packed holds {codes.shape[1]} columns, K={k}")
    codes = codes[:, :k]
    groups = int(weight_scale.shape[1])
    require(groups > 0 and k % groups == 0, f"{groups} scale groups do not divide K={k}")
    if num_bits == 8:
        require(
            groups == 1 and weight_zero_point is None,
            "8-bit weights load as W8A16, which is symmetric per output channel; this one has "
            f"{groups} groups{' and zero points' if weight_zero_point is not None else ''}",
        )
        return int8_from_codes(codes - offset, weight_scale[:, 0])
    if weight_zero_point is None:
        zeros = torch.full_like(weight_scale, offset, dtype=torch.float32)
    else:
        check_dtype(weight_zero_point, "weight_zero_point", (torch.int32,))
        unpacked = unpack_int32(weight_zero_point, num_bits, dim=0)
        require(
            unpacked.shape[0] >= n and unpacked.shape[1] == groups,
            f"weight_zero_point unpacks to {list(unpacked.shape)}, expected [{n}, {groups}]",
        )
        zeros = unpacked[:n]  # the unsigned code of a signed zero point is zero_point + 8
    return int4_from_codes(codes, zeros, weight_scale, k // groups)
