"""The `cpu` row of the kernel table: the code the CPU engine serves with.

Two variants, chosen once for the model's dtype (`cpu_backend`):

- float32 with the C kernel built (the usual case): decode attention reads
  the paged cache in place in C (`native_decode.py`), RMSNorm, RoPE,
  SiLU-and-mul and the K/V write are one C call each
  (`native_elementwise.py`), and large float32 linears run on oneDNN
  (`linear.py`, the `fast_linears` feature);
- otherwise (bfloat16/float16, or no C compiler): decode attention is
  `planned_decode`: one gather plan per step, shared by all layers, then a
  padded SDPA per group of similar lengths (`attention.py`); linears stay on
  `F.linear`, so a machine that cannot build the C kernel runs the plain
  PyTorch path whole.

Prefill: in float32 with the C kernel, the positions of prompts of at most
`native_decode.ROWS_MAX_CONTEXT` tokens of context run as rows of the decode kernel
(each attending to its sequence up to itself), longer prompts per-sequence SDPA;
otherwise per-sequence SDPA for all. The second runs the elementwise ops of
`elementwise.py`. None re-validates arguments per call. The int8 KV cache
(`kv_int8`) and the weight-only matmuls have no faster CPU code: with scales,
the KV ops are the reference's (checked, float32), as are W8A16/W4A16. The
LoRA BGMV and SGMV are `lora.py`'s: the C kernel of native_lora.c in float32,
reading each row's adapter in place (PyTorch otherwise).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from hydrant.kernels import reference_backend as checked
from hydrant.kernels.cpu import (
    attention,
    elementwise,
    linear,
    lora,
    native_decode,
    native_elementwise,
)
from hydrant.kernels.errors import KernelBackendError
from hydrant.kernels.table import DecodeAttention, KernelBackend

# decode attention over a float cache: (q, k_cache, v_cache, block_tables, context_lens, scale)
FloatDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor
]


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    if k_scale is None and v_scale is None:
        native_elementwise.write_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    checked.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def _decode_with(decode: FloatDecode) -> DecodeAttention:
    """`decode` for float caches, the reference for int8 ones."""

    def paged_decode_attention(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if k_scale is None and v_scale is None:
            return decode(q, k_cache, v_cache, block_tables, context_lens, scale)
        return checked.paged_decode_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            context_lens,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
        )

    return paged_decode_attention


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
    if k_scale is None and v_scale is None:
        return native_decode.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale
        )
    return checked.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        scale,
        max_seqlen_q,
        k_scale=k_scale,
        v_scale=v_scale,
    )


NATIVE = KernelBackend(
    name="cpu",
    detail="C decode and short-prompt prefill attention, oneDNN linears, PyTorch long prefill",
    features=frozenset({"kv_int8", "fast_linears"}),
    write_kv=write_kv,
    paged_decode_attention=_decode_with(native_decode.paged_decode_attention),
    paged_prefill_attention=paged_prefill_attention,
    rms_norm=native_elementwise.rms_norm,
    rotary_embedding=native_elementwise.rotary_embedding,
    silu_and_mul=native_elementwise.silu_and_mul,
    w8a16_matmul=checked.w8a16_matmul,
    w4a16_matmul=checked.w4a16_matmul,
    lora_bgmv=lora.lora_bgmv,
    lora_sgmv=lora.lora_sgmv,
    optimize_linears=linear.use_onednn_linears,
    linear_for=linear.linear_for,
)

PLANNED = dataclasses.replace(
    NATIVE,
    detail="PyTorch planned decode and prefill",
    features=frozenset({"kv_int8", "planned_decode"}),
    paged_decode_attention=_decode_with(attention.paged_decode_attention),
    rms_norm=elementwise.rms_norm,
    rotary_embedding=elementwise.rotary_embedding,
    silu_and_mul=elementwise.silu_and_mul,
    decode_planner=attention.decode_planner,
    planned_decode_attention=attention.planned_decode_attention,
    optimize_linears=None,
    linear_for=None,
)


def cpu_backend(dtype: torch.dtype, *, require_native: bool = False) -> KernelBackend:
    """The variant for a model computing in `dtype`: NATIVE in float32 when the C kernel
    builds (building it on first call), PLANNED otherwise. `require_native` refuses a
    machine where it cannot build (the failure is logged), whatever the dtype."""
    if require_native and not native_decode.available():
        raise KernelBackendError(
            "the cpu backend's C decode attention could not be built (the build failure is "
            "logged); it needs a C compiler (cc/gcc, or CC)"
        )
    return NATIVE if dtype == torch.float32 and native_decode.available() else PLANNED
