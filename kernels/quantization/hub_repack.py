"""Hub checkpoints' codes in Hydrant's W4A16 / W8A16 layouts, fused, as `QuantizedLinear`.

The format readers (`hub_awq`, `hub_gptq`, `hub_compressed_tensors`) only
unpack their int32 words into plain codes `[N, K]` and zero points `[N, G]`;
this module owns what they share: packing codes into Hydrant's byte layout
(`hydrant.kernels.int4_layout`), spreading a per-channel scale over kernel-sized
groups, concatenating the parts of a fused matrix along N, and building the
module the engine runs. Everything happens once, at load: the kernels then
read Hydrant's layout as they do for `hydrant models quantize` checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hydrant.kernels.arguments import check_rank, require
from hydrant.kernels.int4_layout import pack_int4
from hydrant.kernels.quantization.linear import QuantizedLinear, QuantMode

# A per-channel int4 scale is repeated over groups of at most this many columns: the
# Triton W4A16 kernels tile K by power-of-2 groups (32 .. 128), never by a whole row.
CHANNEL_GROUP_CAP = 128


@dataclass(frozen=True)
class RepackedWeight:
    """One linear's weight in Hydrant's layout: what `QuantizedLinear` holds as buffers.

    int4: `qweight` uint8 `[N, K // 2]`, `scales` / `zeros` `[N, K // group_size]`
    (float, `w = (q - zeros) * scales`); int8: `qweight` int8 `[N, K]`, `scales`
    `[N]`, `zeros` None (symmetric per output channel).
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    group_size: int

    @property
    def mode(self) -> QuantMode:
        return "int8" if self.zeros is None else "int4"

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    @property
    def in_features(self) -> int:
        columns = int(self.qweight.shape[1])
        return columns if self.zeros is None else 2 * columns


def channel_group_size(in_features: int) -> int:
    """The group a per-channel int4 scale is spread over: the largest power of 2 dividing K,
    at most `CHANNEL_GROUP_CAP` (repeating one scale per group is exact, and keeps the
    Triton kernels' power-of-2 groups); K itself when K is odd, which int4 then refuses
    (two columns share a byte)."""
    group = CHANNEL_GROUP_CAP
    while group > 2 and in_features % group:
        group //= 2
    return group if in_features % group == 0 else in_features


def int4_from_codes(
    codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> RepackedWeight:
    """Unsigned 4-bit `codes [N, K]`, zero points and scales `[N, K // group_size]`.

    `group_size` equal to K is a per-channel weight (one group a row); it is
    spread over `channel_group_size(K)` columns so the kernels can tile it.
    """
    check_rank(codes, "codes", 2, "[N, K]")
    n, k = codes.shape
    require(group_size > 0 and k % group_size == 0, f"group_size {group_size} must divide K={k}")
    groups = k // group_size
    for name, tensor in (("zeros", zeros), ("scales", scales)):
        require(
            tuple(tensor.shape) == (n, groups),
            f"{name} must be [N, K // group_size] = {[n, groups]}, got {list(tensor.shape)}",
        )
    require(
        bool(((codes >= 0) & (codes < 16)).all()), "int4 codes must lie in 0..15 after unpacking"
    )
    if groups == 1 and group_size % 2 == 0:
        target = channel_group_size(k)
        scales = scales.expand(n, k // target).contiguous()
        zeros = zeros.expand(n, k // target).contiguous()
        group_size = target
    require(group_size % 2 == 0, f"int4 needs an even group_size, got {group_size}")
    float_type = scales.dtype if scales.is_floating_point() else torch.float32
    return RepackedWeight(  # contiguous: the kernels need unit strides, readers transpose
        qweight=pack_int4(codes.contiguous()).contiguous(),
        scales=scales.to(float_type).contiguous(),
        zeros=zeros.to(float_type).contiguous(),
        group_size=group_size,
    )


def int8_from_codes(codes: torch.Tensor, scales: torch.Tensor) -> RepackedWeight:
    """Signed 8-bit `codes [N, K]` with one symmetric scale per output channel `[N]`."""
    check_rank(codes, "codes", 2, "[N, K]")
    require(bool(((codes >= -128) & (codes <= 127)).all()), "int8 codes must lie in -128..127")
    require(
        tuple(scales.shape) == (codes.shape[0],),
        f"int8 scales must be [N] = [{codes.shape[0]}], got {list(scales.shape)}",
    )
    return RepackedWeight(
        qweight=codes.to(torch.int8).contiguous(),
        scales=scales.contiguous(),
        zeros=None,
        group_size=int(codes.shape[1]),
    )


def fuse_rows(parts: Sequence[RepackedWeight]) -> RepackedWeight:
    """Concatenate weights along N (q/k/v, gate/up): rows are independent, so this is exact."""
    require(len(parts) > 0, "nothing to fuse")
    first = parts[0]
    for part in parts[1:]:
        require(
            (part.mode, part.group_size, part.in_features)
            == (first.mode, first.group_size, first.in_features),
            "fused parts must share mode, group size and K: "
            f"{(first.mode, first.group_size, first.in_features)} vs "
            f"{(part.mode, part.group_size, part.in_features)}",
        )
    if len(parts) == 1:
        return first
    zeros = (
        None if first.zeros is None else torch.cat([p.zeros for p in parts if p.zeros is not None])
    )
    return RepackedWeight(
        qweight=torch.cat([p.qweight for p in parts]),
        scales=torch.cat([p.scales for p in parts]),
        zeros=zeros,
        group_size=first.group_size,
    )


def quantized_linear(
    weight: RepackedWeight, bias: torch.Tensor | None, dtype: torch.dtype
) -> QuantizedLinear:
    """The module holding `weight` (scales and zeros in `dtype`, the model's compute dtype)."""
    module = QuantizedLinear(
        weight.in_features,
        weight.out_features,
        weight.mode,
        group_size=weight.group_size if weight.mode == "int4" else 128,
        bias=bias is not None,
        dtype=dtype,
        device="meta",
    )
    # assigning a registered buffer's name swaps the meta placeholder (nothing allocated twice)
    module.qweight = weight.qweight
    module.scales = weight.scales.to(dtype)
    if weight.zeros is not None:
        module.zeros = weight.zeros.to(dtype)
    if bias is not None:
        module.bias = bias.to(dtype)
    return module
