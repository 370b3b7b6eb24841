"""Which implementation of the model's kernels a model instance calls.

The engine's own pure-torch versions (attention.py, layers.py) and the
Triton kernels of `hydrant.kernels.ops` share one set of signatures, so the
choice is a value passed to the model at build time, not an import: CUDA
runs the Triton kernels, CPU the torch versions (tuned for the CPU: no
argument re-validation per call, batched decode gathers), with decode
attention from the native CPU kernel (cpu_kernels.py) when it builds and the
model runs in float32 (`kernels="native"` requires it, `"torch"` never uses
it). `kernels="hydrant"`
forces `hydrant.kernels.ops` on any device; on CPU it runs the kernel
package's references, which is how the integration is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from hydrant.engine import attention, cpu_kernels, layers
from hydrant.engine.engine_config import EngineConfigError


@dataclass(frozen=True)
class KernelOps:
    name: str
    write_kv: Callable[..., None]
    paged_decode_attention: Callable[..., torch.Tensor]
    paged_prefill_attention: Callable[..., torch.Tensor]
    rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rotary_embedding: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[..., torch.Tensor]
    onednn_linear: bool = False  # float32 CPU linears through oneDNN (engine/cpu_linear.py)


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


def native_cpu_ops() -> KernelOps:
    """The torch ops with decode attention read in place by the C kernel, and oneDNN
    float32 linears (the fast CPU path; "torch" stays the plain PyTorch reference)."""
    return replace(
        TORCH_OPS,
        name="torch+native",
        paged_decode_attention=cpu_kernels.paged_decode_attention,
        onednn_linear=True,
    )


def select_ops(choice: str, device: torch.device, dtype: torch.dtype = torch.float32) -> KernelOps:
    """ "auto": the Triton kernels on CUDA; on CPU the torch versions, with the native
    decode attention when the model computes in float32 and the kernel builds."""
    if choice == "native":
        if device.type != "cpu" or not cpu_kernels.available():
            raise EngineConfigError(
                "kernels='native' needs the CPU and a C compiler (the build failure is logged)"
            )
        return native_cpu_ops()
    if choice == "torch":
        return TORCH_OPS
    if choice == "auto" and device.type != "cuda":
        if dtype == torch.float32 and cpu_kernels.available():
            return native_cpu_ops()
        return TORCH_OPS
    return hydrant_kernel_ops()
