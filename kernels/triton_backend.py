"""The `triton` row of the kernel table: each op calls its Triton launcher, imported on first use.

The launchers (`kv_write.py`, `decode_attention.py`, ...) check shapes,
strides, dtypes and the device themselves and have the table's signatures,
so this row only forwards (prefill adapts `max_seqlen_q`). They
are imported lazily: importing the table never imports Triton, so CPU
processes (and test sessions that set `TRITON_INTERPRET` later) never load it.

Triton runs on CUDA tensors, or on CPU tensors under `TRITON_INTERPRET=1`
(the kernel tests); anywhere else the launchers raise `KernelBackendError`.
Every launcher is capturable in a CUDA graph (no host sync, allocations from
the caching allocator) provided prefill gets `max_seqlen_q`; the decode split
count depends only on shapes, so one graph per decode batch size and
block-table width replays correctly for any context lengths.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hydrant.kernels.errors import KernelBackendError
from hydrant.kernels.table import KernelBackend


def triton_interpreter_enabled() -> bool:
    """True when Triton runs kernels on the CPU through its interpreter (tests only).

    `TRITON_INTERPRET` is Triton's own switch, read when a kernel is decorated; the
    launchers check it to refuse CPU tensors without it, and an engine asked for
    `kernels="triton"` on the CPU checks it once, at build.
    """
    return os.environ.get("TRITON_INTERPRET", "").strip() not in {"", "0", "false", "False"}


@functools.cache
def _launcher(module: str) -> ModuleType:
    try:
        return importlib.import_module(f"hydrant.kernels.{module}")
    except ImportError as exc:
        raise KernelBackendError(f"the Triton backend is unavailable: {exc}") from exc


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    max_seqlen_q: int | None = None,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    out: torch.Tensor = _launcher("prefill_attention").paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        scale,
        k_scale=k_scale,
        v_scale=v_scale,
        max_seqlen_q=max_seqlen_q,
    )
    return out


def _forward(module: str, name: str) -> Callable[..., Any]:
    """Op `name` of launcher module `module`, imported on the first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(_launcher(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


TRITON = KernelBackend(
    name="triton",
    detail="Triton kernels (CUDA; the CPU only under TRITON_INTERPRET=1)",
    features=frozenset({"kv_int8", "graph_capture"}),
    write_kv=_forward("kv_write", "write_kv"),
    paged_decode_attention=_forward("decode_attention", "paged_decode_attention"),
    paged_prefill_attention=paged_prefill_attention,  # max_seqlen_q is keyword-only there
    rms_norm=_forward("rms_norm", "rms_norm"),
    rotary_embedding=_forward("rotary", "rotary_embedding"),
    silu_and_mul=_forward("activation", "silu_and_mul"),
    w8a16_matmul=_forward("quant_matmul", "w8a16_matmul"),
    w4a16_matmul=_forward("quant_matmul", "w4a16_matmul"),
    lora_bgmv=_forward("lora", "lora_bgmv"),
    lora_sgmv=_forward("lora", "lora_sgmv"),
)
