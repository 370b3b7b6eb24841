"""The `reference` row of the kernel table: arguments checked, then `reference.py` computes.

The references are the ground truth every kernel test compares with, so this
row validates exactly as the Triton launchers do (`arguments.py`, raising
`KernelArgumentError` before any work) and then runs the plain PyTorch
function. It runs on any device, holds the int8 KV cache, and is what
`kernels="reference"` serves: slower than the `cpu` row, never different in
what it computes.
"""

from __future__ import annotations

import torch

from hydrant.kernels import arguments, reference
from hydrant.kernels.table import KernelBackend


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    arguments.check_write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    reference.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


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
    arguments.check_attention(q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale)
    return reference.paged_decode_attention(
        q, k_cache, v_cache, block_tables, context_lens, scale, k_scale=k_scale, v_scale=v_scale
    )


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
    arguments.check_attention(
        q, k_cache, v_cache, block_tables, context_lens, k_scale, v_scale, cu_seqlens_q
    )
    return reference.paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens_q,
        context_lens,
        scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    arguments.check_rms_norm(x, weight, residual)
    return reference.rms_norm(x, weight, eps, residual)


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    arguments.check_rotary(positions, q, k, cos_sin_cache)
    return reference.rotary_embedding(positions, q, k, cos_sin_cache)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    arguments.check_silu_and_mul(x)
    return reference.silu_and_mul(x)


def w8a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    arguments.check_w8a16(x, qweight, scales)
    return reference.w8a16_matmul(x, qweight, scales)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
) -> torch.Tensor:
    arguments.check_w4a16(x, qweight, scales, zeros, group_size)
    return reference.w4a16_matmul(x, qweight, scales, zeros, group_size)


def lora_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    arguments.check_lora_bgmv(y, x, lora_a, lora_b, scales, token_slots)
    reference.lora_bgmv(y, x, lora_a, lora_b, scales, token_slots)


def lora_sgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_slots: torch.Tensor,
    max_seg_len: int | None = None,
) -> None:
    arguments.check_lora_sgmv(y, x, lora_a, lora_b, scales, seg_starts, seg_slots)
    reference.lora_sgmv(y, x, lora_a, lora_b, scales, seg_starts, seg_slots, max_seg_len)


REFERENCE = KernelBackend(
    name="reference",
    detail="PyTorch references, arguments checked",
    features=frozenset({"kv_int8"}),
    write_kv=write_kv,
    paged_decode_attention=paged_decode_attention,
    paged_prefill_attention=paged_prefill_attention,
    rms_norm=rms_norm,
    rotary_embedding=rotary_embedding,
    silu_and_mul=silu_and_mul,
    w8a16_matmul=w8a16_matmul,
    w4a16_matmul=w4a16_matmul,
    lora_bgmv=lora_bgmv,
    lora_sgmv=lora_sgmv,
)
