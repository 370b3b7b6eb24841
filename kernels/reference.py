"""PyTorch references of every kernel: the `reference` backend and the tests' oracle.

Each function has exactly the signature of its op in the kernel table and
computes in float32, rounding once to the output dtype, which is what the
Triton kernels do too; tests compare kernel against reference and reference
against a naive dense computation (SDPA over gathered K/V, dense matmul), so
both ends are pinned. Clarity beats speed here (the CPU engine serves with
the `cpu` backend), but an engine can run these for real (`kernels="reference"`,
and the `cpu` backend's int8 KV cache and quantized matmuls), so the hot paths
avoid per-token Python loops (attention loops per sequence, not per token).

Arguments are validated by the `reference` row (`reference_backend.py`) before
these run; they assume valid shapes and only check what needs tensor values.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hydrant.kernels.arguments import require
from hydrant.kernels.int4_layout import dequantize_int4

INT8_MAX = 127.0


def quantize_kv_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per token per head: `scale = amax / 127`, `q = floor(x / scale + 0.5)`.

    Rounding is half-up (not half-to-even) because that is what the kernel can
    express exactly with `floor`; an all-zero vector gets scale 0 and codes 0.
    """
    xf = x.to(torch.float32)
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.floor(xf / safe[..., None] + 0.5).clamp_(-INT8_MAX, INT8_MAX)
    return codes.to(torch.int8), scale


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    block_size = k_cache.shape[1]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].to(torch.int64)
    blocks, offsets = slots // block_size, slots % block_size
    if k_scale is None or v_scale is None:
        k_cache[blocks, offsets] = key[valid]
        v_cache[blocks, offsets] = value[valid]
        return
    k_codes, k_scales = quantize_kv_int8(key[valid])
    v_codes, v_scales = quantize_kv_int8(value[valid])
    k_cache[blocks, offsets] = k_codes
    v_cache[blocks, offsets] = v_codes
    k_scale[blocks, offsets] = k_scales
    v_scale[blocks, offsets] = v_scales


def gather_kv(
    cache: torch.Tensor, scale: torch.Tensor | None, block_row: torch.Tensor, length: int
) -> torch.Tensor:
    """First `length` tokens of one sequence from a paged cache, as float32 `[length, Hkv, D]`."""
    block_size = cache.shape[1]
    needed = -(-length // block_size)
    blocks = block_row[:needed].to(torch.int64)
    tokens = cache[blocks].reshape(-1, *cache.shape[2:])[:length].to(torch.float32)
    if scale is not None:
        tokens = tokens * scale[blocks].reshape(-1, cache.shape[2])[:length, :, None]
    return tokens


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, first_pos: int
) -> torch.Tensor:
    """q `[Lq, H, D]` at positions first_pos.., k/v `[Lk, Hkv, D]` float32 -> `[Lq, H, D]`."""
    lq, heads, dim = q.shape
    kv_heads = k.shape[1]
    qg = q.reshape(lq, kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("qhgd,khd->hgqk", qg, k) * scale
    q_pos = torch.arange(lq, device=q.device)[:, None] + first_pos
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hgqk,khd->qhgd", probs, v)
    return out.reshape(lq, heads, dim)


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    lengths = context_lens.tolist()
    for b, ctx in enumerate(lengths):
        start, end = starts[b], starts[b + 1]
        q_len = end - start
        if q_len == 0:
            continue
        require(
            0 < q_len <= ctx,
            f"sequence {b} has {q_len} queries but a context of {ctx} tokens "
            "(queries are the last positions of the context, so q_len <= context_len)",
        )
        k = gather_kv(k_cache, k_scale, block_tables[b], ctx)
        v = gather_kv(v_cache, v_scale, block_tables[b], ctx)
        attended = _causal_attention(q[start:end].to(torch.float32), k, v, scale, ctx - q_len)
        out[start:end] = attended.to(q.dtype)
    return out


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
    """Decode is prefill with one query per sequence at its last position."""
    cu_seqlens = torch.arange(q.shape[0] + 1, dtype=torch.int32)
    return paged_prefill_attention(
        q,
        k_cache,
        v_cache,
        block_tables,
        cu_seqlens,
        context_lens,
        scale,
        k_scale=k_scale,
        v_scale=v_scale,
    )


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(normed, new_residual)`; the sum is rounded to x's dtype before it is normalised (as HF)."""
    summed = x if residual is None else x + residual
    xf = summed.to(torch.float32)
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (normed * weight.to(torch.float32)).to(x.dtype), summed


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox / HF rotate-half rotation of the first `cos_sin_cache.shape[1]` dims; new tensors."""
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache[positions.to(torch.int64)].to(torch.float32)
    cos, sin = rows[:, None, :half], rows[:, None, half:]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.float32)
        x1, x2 = xf[..., :half], xf[..., half : 2 * half]
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, xf[..., 2 * half :]), -1)
        return rotated.to(x.dtype)

    return rotate(q), rotate(k)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.to(torch.float32).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def w8a16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    acc = x.to(torch.float32) @ qweight.to(torch.float32).t()
    return (acc * scales.to(torch.float32)).to(x.dtype)


def w4a16_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
) -> torch.Tensor:
    weight = dequantize_int4(qweight, scales, zeros, group_size)
    return (x.to(torch.float32) @ weight.t()).to(x.dtype)


def lora_bgmv(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    token_slots: torch.Tensor,
) -> None:
    """Punica's BGMV, in place: `y[t] += scales[s] * (x[t] @ lora_a[s].T) @ lora_b[s].T` with
    `s = token_slots[t]`; rows of slot -1 (no adapter) are not touched at all.

    Each row gathers its adapter's matrices (decode batches: a row per sequence), so a batch
    of many adapters is two batched matmuls, not a loop over adapters.
    """
    rows = (token_slots >= 0).nonzero().squeeze(1)
    if rows.numel() == 0:
        return
    slots = token_slots.index_select(0, rows).long()
    xs = x.index_select(0, rows).to(torch.float32).unsqueeze(1)
    mid = torch.bmm(xs, lora_a.index_select(0, slots).to(torch.float32).transpose(1, 2))
    delta = torch.bmm(mid, lora_b.index_select(0, slots).to(torch.float32).transpose(1, 2))
    delta = delta.squeeze(1) * scales.index_select(0, slots)[:, None]
    y[rows] = (y.index_select(0, rows).to(torch.float32) + delta).to(y.dtype)


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
    """Punica's SGMV, in place: rows `seg_starts[g]:seg_starts[g + 1]` (one prefill chunk) add
    `scales[s] * (x @ lora_a[s].T) @ lora_b[s].T` of their segment's slot `s = seg_slots[g]`;
    segments of slot -1 and empty ones are skipped. `max_seg_len` sizes the Triton grid; the
    reference reads the segments from the tensors."""
    del max_seg_len
    starts = seg_starts.tolist()
    for g, slot in enumerate(seg_slots.tolist()):
        first, end = starts[g], starts[g + 1]
        if slot < 0 or end <= first:
            continue
        mid = x[first:end].to(torch.float32) @ lora_a[slot].to(torch.float32).t()
        delta = (mid @ lora_b[slot].to(torch.float32).t()) * scales[slot]
        y[first:end] = (y[first:end].to(torch.float32) + delta).to(y.dtype)
