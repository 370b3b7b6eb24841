"""GPTQ checkpoints (AutoGPTQ / GPTQModel, `quant_method: gptq`, `desc_act: false`) to W4A16.

Per quantized linear with `K` inputs, `N` outputs and group size `G` (the
`checkpoint_format` "gptq", also called v1):

- `qweight` int32 `[K // 8, N]`: eight 4-bit codes a word along K, sequential
  (bits `4i ..` hold row `8 * word + i`);
- `qzeros` int32 `[K // G, N // 8]`: zero points packed sequentially along N,
  each stored minus one (the exporters' historical offset), so `z = stored + 1`
  (a symmetric checkpoint stores 7: `z = 8`); format "gptq_v2" stores `z` itself;
- `scales` float `[K // G, N]`;
- `g_idx` int32 `[K]`: the group of each input row. Without activation
  reordering (`desc_act: false`) it is `k // G`; anything else reorders rows
  and is refused here rather than served wrong.

`w[n, k] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]`.
"""

from __future__ import annotations

import torch

from hydrant.kernels.arguments import check_dtype, check_rank, require
from hydrant.kernels.quantization.hub_repack import RepackedWeight, int4_from_codes
from hydrant.kernels.quantization.int32_packing import unpack_int32

GPTQ_TENSORS = ("qweight", "qzeros", "scales", "g_idx")
V1_ZERO_OFFSET = 1  # checkpoint_format "gptq": zero points stored minus one
V2_ZERO_OFFSET = 0  # checkpoint_format "gptq_v2": stored as they are


def repack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    group_size: int,
    zero_offset: int = V1_ZERO_OFFSET,
) -> RepackedWeight:
    """One GPTQ linear as Hydrant int4; `group_size` -1 means one group of K (per channel)."""
    for name, tensor in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        check_rank(tensor, name, 2, "2-D")
    check_dtype(qweight, "qweight", (torch.int32,))
    check_dtype(qzeros, "qzeros", (torch.int32,))
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    group = k if group_size == -1 else group_size
    require(group > 0 and k % group == 0, f"group_size {group_size} must divide K={k}")
    require(
        n % 8 == 0
        and tuple(qzeros.shape) == (k // group, n // 8)
        and tuple(scales.shape) == (k // group, n),
        f"GPTQ qzeros / scales must be [K // G, N // 8] / [K // G, N] with K={k}, G={group}, "
        f"N={n}; got {list(qzeros.shape)} / {list(scales.shape)}",
    )
    if g_idx is not None:
        trivial = torch.arange(k, device=g_idx.device) // group
        require(
            tuple(g_idx.shape) == (k,) and torch.equal(g_idx.to(torch.int64), trivial),
            "g_idx is not k // group_size: the rows are reordered (act-order / desc_act), "
            "which Hydrant's kernels do not serve",
        )
    codes = unpack_int32(qweight, 4, dim=0)  # [K, N]
    zeros = unpack_int32(qzeros, 4, dim=1) + zero_offset  # [K // G, N]
    return int4_from_codes(codes.t(), zeros.t(), scales.t(), group)
