"""Paged attention in pure PyTorch, with the signatures of the Triton kernels.

The KV cache of a layer is two tensors `[num_blocks, block_size, Hkv, D]`; a
sequence owns a list of block ids (its block table), so tokens of one
sequence are scattered over the pool. These functions gather them back.

The decode path is vectorized over the batch (one gather of `[B, max_ctx]`
through the block tables and one masked SDPA), since decodes are most of a
step's sequences. The prefill path loops over sequences: their query lengths
differ, and padding them to one length would waste more than the loop costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Where a step's tokens live in the paged cache; passed explicitly through the model.

    The step's flattened tokens are ordered decodes first (one token each),
    then prefill chunks, so each attention path reads one contiguous slice.
    """

    slot_mapping: torch.Tensor
    num_decode_tokens: int
    decode_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    prefill_cu_seqlens_q: torch.Tensor
    prefill_context_lens: torch.Tensor
    prefill_max_q_len: int = 0
    decode_plan: DecodePlan | None = None  # the torch path's per-step gather plan

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_context_lens.shape[0])


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's K/V [T, Hkv, D] into the cache at their slots (-1 = skip)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slots, key[keep].to(k_cache.dtype))
    v_flat.index_copy_(0, slots, value[keep].to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[B, nblocks] block ids -> [B, nblocks * block_size, Hkv, D] tokens."""
    blocks = cache.index_select(0, block_table.reshape(-1).long())
    batch = block_table.shape[0]
    return blocks.view(batch, -1, cache.shape[2], cache.shape[3])


DECODE_GROUP = 16  # sequences per padded attention call (sorted by context length)


@dataclass
class DecodeGroup:
    """Up to DECODE_GROUP decode sequences of similar context length, padded together."""

    index: torch.Tensor  # rows of q that belong to the group
    block_ids: torch.Tensor  # [g * num_blocks] long: every row's blocks, padded with block 0
    mask: torch.Tensor  # [g, 1, 1, num_blocks * block_size] bool: real context positions


DecodePlan = list[DecodeGroup]


def plan_decode(
    tables: list[list[int]], context_lens: list[int], block_size: int, device: torch.device
) -> DecodePlan:
    """Sort by context length and cut into groups, so a 30-token context never pays for a
    2,000-token neighbour's padding. Built once per step and reused by every layer."""
    order = list(range(len(context_lens)))
    if len(order) > DECODE_GROUP:  # one group keeps the batch order (planned_... relies on it)
        order.sort(key=context_lens.__getitem__)
    plan: DecodePlan = []
    for first in range(0, len(order), DECODE_GROUP):
        rows = order[first : first + DECODE_GROUP]
        num_blocks = -(-max(context_lens[r] for r in rows) // block_size)
        ids = [b for r in rows for b in (tables[r] + [0] * num_blocks)[:num_blocks]]
        lens = torch.tensor([context_lens[r] for r in rows], device=device)
        positions = torch.arange(num_blocks * block_size, device=device)
        plan.append(
            DecodeGroup(
                index=torch.tensor(rows, device=device),
                block_ids=torch.tensor(ids, dtype=torch.long, device=device),
                mask=(positions[None, :] < lens[:, None])[:, None, None, :],
            )
        )
    return plan


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence [B, H, D] against its whole context (already in the cache)."""
    if q.shape[0] == 0:
        return q
    plan = plan_decode(block_tables.tolist(), context_lens.tolist(), k_cache.shape[1], q.device)
    return planned_decode_attention(q, k_cache, v_cache, plan, scale)


def planned_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float
) -> torch.Tensor:
    """Padded gather + masked SDPA per group; the G query heads of a KV head ride as G rows.

    Viewing q as [B, Hkv, G, D] makes GQA a plain attention of G "positions"
    per KV head (no causal mask: they are one position), so K/V are never
    repeated per query head.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    grouped = q.view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    if len(plan) == 1:  # a single group is in batch order
        return _attend_group(grouped, k_cache, v_cache, plan[0], scale).reshape(q.shape)
    out = torch.empty_like(grouped)
    for group in plan:
        out[group.index] = _attend_group(grouped[group.index], k_cache, v_cache, group, scale)
    return out.reshape(q.shape)


def _attend_group(
    grouped_q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: DecodeGroup,
    scale: float,
) -> torch.Tensor:
    rows, num_kv_heads, head_dim = grouped_q.shape[0], k_cache.shape[2], k_cache.shape[3]
    shape = (rows, -1, num_kv_heads, head_dim)
    keys = k_cache.index_select(0, group.block_ids).view(shape).transpose(1, 2)
    values = v_cache.index_select(0, group.block_ids).view(shape).transpose(1, 2)
    return F.scaled_dot_product_attention(
        grouped_q,
        keys.to(grouped_q.dtype),
        values.to(grouped_q.dtype),
        attn_mask=group.mask,
        scale=scale,
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
) -> torch.Tensor:
    """Causal attention of each sequence's last q_len positions over its whole context.

    Earlier context (prefix-cache hits, earlier chunks) is read from the cache
    like the new tokens, which were written there before this call.
    """
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    gqa = q.shape[1] != k_cache.shape[2]
    for b, ctx in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        num_blocks = -(-ctx // block_size)
        table = block_tables[b : b + 1, :num_blocks]
        keys = _gather(k_cache, table)[0, :ctx].transpose(0, 1).to(q.dtype)  # [Hkv, ctx, D]
        values = _gather(v_cache, table)[0, :ctx].transpose(0, 1).to(q.dtype)
        query = q[q_start:q_end].transpose(0, 1)  # [H, q_len, D]
        if q_len == ctx:
            attn = F.scaled_dot_product_attention(
                query, keys, values, is_causal=True, scale=scale, enable_gqa=gqa
            )
        else:
            offset = ctx - q_len
            rows = torch.arange(q_len, device=q.device)[:, None] + offset
            cols = torch.arange(ctx, device=q.device)[None, :]
            attn = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=cols <= rows, scale=scale, enable_gqa=gqa
            )
        out[q_start:q_end] = attn.transpose(0, 1)
    return out
