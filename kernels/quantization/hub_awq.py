"""AWQ GEMM checkpoints (AutoAWQ, `quant_method: awq`, `version: gemm`) to Hydrant's W4A16.

Per quantized linear with `K` inputs, `N` outputs and group size `G`, AutoAWQ's
`WQLinear_GEMM` stores (transposed against `nn.Linear.weight`):

- `qweight` int32 `[K, N // 8]`: eight 4-bit codes a word along N, in AWQ's
  interleaved order (bits `4i ..` hold column `AWQ_ORDER[i]` of the word's eight);
- `qzeros` int32 `[K // G, N // 8]`: the zero points, packed the same way;
- `scales` float `[K // G, N]`;

and `w[n, k] = (q[k, n] - z[k // G, n]) * s[k // G, n]`, Hydrant's own rule.
"""

from __future__ import annotations

import torch

from hydrant.kernels.arguments import check_dtype, check_rank, require
from hydrant.kernels.quantization.hub_repack import RepackedWeight, int4_from_codes
from hydrant.kernels.quantization.int32_packing import AWQ_ORDER, unpack_int32

AWQ_TENSORS = ("qweight", "qzeros", "scales")


def repack_awq_gemm(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> RepackedWeight:
    """One AWQ GEMM linear as Hydrant int4; `group_size` -1 means one group of K."""
    for name, tensor in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        check_rank(tensor, name, 2, "2-D")
    check_dtype(qweight, "qweight", (torch.int32,))
    check_dtype(qzeros, "qzeros", (torch.int32,))
    k, n = qweight.shape[0], scales.shape[1]
    group = k if group_size == -1 else group_size
    require(group > 0 and k % group == 0, f"group_size {group_size} must divide K={k}")
    require(
        tuple(qweight.shape) == (k, n // 8) and n % 8 == 0,
        f"AWQ qweight must be [K, N // 8] = {[k, n // 8]}, got {list(qweight.shape)}",
    )
    require(
        tuple(qzeros.shape) == (k // group, n // 8) and tuple(scales.shape) == (k // group, n),
        f"AWQ qzeros / scales must be [K // G, N // 8] / [K // G, N] with K={k}, G={group}, "
        f"N={n}; got {list(qzeros.shape)} / {list(scales.shape)}",
    )
    codes = unpack_int32(qweight, 4, dim=1, order=AWQ_ORDER)  # [K, N]
    zeros = unpack_int32(qzeros, 4, dim=1, order=AWQ_ORDER)  # [K // G, N]
    return int4_from_codes(codes.t(), zeros.t(), scales.t(), group)
