"""The packed INT4 weight layout shared by the W4A16 kernel, its reference and the quantizer.

A weight `w[N, K]` is stored as `qweight: uint8[N, K // 2]`, two 4-bit codes per
byte: byte `qweight[n, j]` holds column `k = 2j` in its LOW nibble and column
`k = 2j + 1` in its HIGH nibble (`byte = q[2j] | (q[2j+1] << 4)`). Codes are
unsigned, 0..15. Columns are grouped along K in runs of `group_size`; group
`g = k // group_size` of row `n` has `scales[n, g]` and `zeros[n, g]`, and
dequantization is `w[n, k] = (q[n, k] - zeros[n, g]) * scales[n, g]`. Zero
points are stored as floats (same dtype as the scales), which keeps the
kernel's inner loop a subtract-multiply and allows non-integer zeros, e.g.
from activation-aware search; round-to-nearest writes integers 0..15.

Keeping K-major rows (one output channel per row, like `nn.Linear.weight`)
means the kernel reads a contiguous run of bytes per output channel.
"""

from __future__ import annotations

import torch

from hydrant.kernels.arguments import check_dtype, check_rank, require


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes `[N, K]` (any integer dtype, values 0..15) into `uint8[N, K//2]`."""
    check_rank(codes, "codes", 2, "[N, K]")
    require(codes.shape[1] % 2 == 0, f"K={codes.shape[1]} must be even to pack two codes a byte")
    c = codes.to(torch.uint8)
    return c[:, 0::2] | (c[:, 1::2] << 4)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: `uint8[N, K//2]` -> `uint8[N, K]` codes."""
    check_rank(qweight, "qweight", 2, "[N, K // 2]")
    check_dtype(qweight, "qweight", (torch.uint8,))
    low = qweight & 0x0F
    high = qweight >> 4
    return torch.stack((low, high), dim=-1).reshape(qweight.shape[0], qweight.shape[1] * 2)


def dequantize_int4(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int
) -> torch.Tensor:
    """Float32 `[N, K]` weight from the packed layout (the W4A16 reference uses this)."""
    codes = unpack_int4(qweight).to(torch.float32)
    n, k = codes.shape
    require(k % group_size == 0, f"group_size {group_size} must divide K={k}")
    grouped = codes.view(n, k // group_size, group_size)
    weight = (grouped - zeros.to(torch.float32)[..., None]) * scales.to(torch.float32)[..., None]
    return weight.reshape(n, k)
