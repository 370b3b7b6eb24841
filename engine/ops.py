"""Which implementation of the model's kernels a model instance calls.

The engine's own pure-torch versions (attention.py, layers.py) and the
Triton kernels of `hydrant.kernels.ops` share one set of signatures, so the
choice is a value passed to the model at build time, not an import: CUDA
runs the Triton kernels, CPU the torch versions (tuned for the CPU: no
argument re-validation per call, batched decode gathers). `kernels="hydrant"`
forces `hydrant.kernels.ops` on any device; on CPU it runs the kernel
package's references, which is how the integration is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hydrant.engine import attention, layers


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable[..., None]
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary_embedding: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]


TORCH_OPS = KernelOps(
    name="torch",
    write_kv=attention.write_kv,
    paged_decode_attention=attention.paged_decode_attention,
    paged_prefill_attention=attention.paged_prefill_attention,
    rms_norm=layers.rms_norm,
    rotary_embedding=layers.rotary_embedding,
    silu_and_mul=layers.silu_and_mul,
)


def hydrant_kernel_ops() -> KernelOps:
    """`hydrant.kernels.ops` (imported lazily: it is only needed when chosen)."""
    from hydrant.kernels import ops

    def prefill(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        max_seqlen_q: int | None = None,
    ) -> torch.Tensor:
        result: torch.Tensor = ops.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_seqlen_q
        )
        return result

    return KernelOps(
        name="hydrant",
        write_kv=ops.write_kv,
        paged_decode_attention=ops.paged_decode_attention,
        paged_prefill_attention=prefill,
        rms_norm=ops.rms_norm,
        rotary_embedding=ops.rotary_embedding,
        silu_and_mul=ops.silu_and_mul,
    )


def select_ops(choice: str, device: torch.device) -> KernelOps:
    """ "auto": the Triton kernels on CUDA, the engine's torch versions elsewhere."""
    if choice == "torch" or (choice == "auto" and device.type != "cuda"):
        return TORCH_OPS
    return hydrant_kernel_ops()
