"""Paged attention in PyTorch, tuned for the CPU: the `cpu` backend's attention.

The KV cache of a layer is two tensors `[num_blocks, block_size, Hkv, D]`; a
sequence owns a list of block ids (its block table), so tokens of one
sequence are scattered over the pool. These functions gather them back.

Unlike `hydrant.kernels.reference` (the tests' oracle, which checks its
arguments and computes in float32 with explicit einsums), this is the code the
CPU engine serves with: no argument re-validation per call, SDPA in the
model's dtype, and decode batched across sequences. The decode path is
vectorized over the batch (one gather of `[B, max_ctx]` through the block
tables and one masked SDPA per group of similar lengths, see `plan_decode`),
since decodes are most of a step's sequences. The prefill path loops over
sequences: their query lengths differ, and padding them to one length would
waste more than the loop costs. Float caches only: the int8 cache is the
reference's (see `cpu/backend.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter the step's K/V [T, Hkv, D] into the cache at their slots (-1 = skip)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:  # the engine never pads; others may
        keep = slot_mapping >= 0
        slot_mapping, key, value = slot_mapping[keep], key[keep], value[keep]
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)
    k_flat.index_copy_(0, slot_mapping, key.to(k_cache.dtype))
    v_flat.index_copy_(0, slot_mapping, value.to(v_cache.dtype))


def _gather(cache: torch.Tensor, block_table: torch.Tensor) -> torch.Tensor:
    """[B, nblocks] block ids -> [B, nblocks * block_size, Hkv, D] tokens."""
    blocks = cache.index_select(0, block_table.reshape(-1).long())
    batch = block_table.shape[0]
    return blocks.view(batch, -1, cache.shape[2], cache.shape[3])


MAX_DECODE_GROUP = 64  # sequences per padded attention call at most
PAD_SLACK = 1.25  # a group's padded context may exceed its rows' own by this factor...
FREE_PAD_BYTES = 1 << 20  # ...or by this much K/V per layer: about what one more call costs


def free_pad_tokens(num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Padding (in tokens) cheaper than splitting a group: FREE_PAD_BYTES of one layer's K+V."""
    per_token = 2 * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
    return FREE_PAD_BYTES // per_token


@dataclass
class DecodeGroup:
    """Decode sequences of similar context length, padded together into one SDPA call.

    `rows` is a slice of the batch when the batch arrives sorted by context
    length (the model runner orders it so), which keeps every per-layer
    gather and scatter of q and of the output away; otherwise an index tensor.
    """

    rows: slice | torch.Tensor
    block_ids: torch.Tensor  # [g * num_blocks] long: every row's blocks, padded with block 0
    mask: torch.Tensor | None  # [g, 1, 1, num_blocks * block_size] bool; None: nothing padded


DecodePlan = list[DecodeGroup]


def cut_groups(sorted_lens: list[int], block_size: int, free_pad: int = 0) -> list[tuple[int, int]]:
    """[start, end) runs of ascending context lengths whose padded area stays within the slack.

    Padding costs memory traffic (every padded slot is gathered and read) and
    each group costs a few kernel launches per layer, so groups grow while the
    padding stays under PAD_SLACK of what the rows would gather alone (whole
    blocks) or under `free_pad` tokens, up to MAX_DECODE_GROUP. Small models
    (few K/V bytes per token) are bound by calls and get big groups; large
    ones by memory traffic and get tight ones.
    """
    groups: list[tuple[int, int]] = []
    start = real = 0
    for i, length in enumerate(sorted_lens):
        padded = -(-length // block_size) * block_size
        rows = i - start + 1
        alone = real + padded
        waste = rows * padded - alone
        if rows > 1 and (
            rows > MAX_DECODE_GROUP or (waste > (PAD_SLACK - 1) * alone and waste > free_pad)
        ):
            groups.append((start, i))
            start, real = i, 0
        real += padded
    if sorted_lens:
        groups.append((start, len(sorted_lens)))
    return groups


def plan_decode(
    tables: list[list[int]],
    context_lens: list[int],
    block_size: int,
    device: torch.device,
    free_pad: int = 0,
) -> DecodePlan:
    """Sort by context length and cut into groups, so a 30-token context never pays for a
    2,000-token neighbour's padding. Built once per step and reused by every layer."""
    order = sorted(range(len(context_lens)), key=context_lens.__getitem__)
    in_order = all(i == r for i, r in enumerate(order))
    lens = [context_lens[r] for r in order]
    plan: DecodePlan = []
    for first, last in cut_groups(lens, block_size, free_pad):
        rows = order[first:last]
        num_blocks = -(-lens[last - 1] // block_size)
        ids = [b for r in rows for b in (tables[r] + [0] * num_blocks)[:num_blocks]]
        mask = None
        if lens[first] != num_blocks * block_size:
            group_lens = torch.tensor(lens[first:last], device=device)
            positions = torch.arange(num_blocks * block_size, device=device)
            mask = (positions[None, :] < group_lens[:, None])[:, None, None, :]
        plan.append(
            DecodeGroup(
                rows=slice(first, last) if in_order else torch.tensor(rows, device=device),
                block_ids=torch.tensor(ids, dtype=torch.long, device=device),
                mask=mask,
            )
        )
    return plan


def decode_planner(
    block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> Callable[[list[list[int]], list[int]], DecodePlan]:
    """The per-step planner of one KV cache's shape: built once, called with each step's
    decode block tables and context lengths (the `planned_decode` feature)."""
    free_pad = free_pad_tokens(num_kv_heads, head_dim, dtype)

    def plan(tables: list[list[int]], context_lens: list[int]) -> DecodePlan:
        return plan_decode(tables, context_lens, block_size, device, free_pad)

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
    if all(isinstance(g.rows, slice) for g in plan):  # sorted batch: groups are consecutive
        parts = [_attend_group(grouped[g.rows], k_cache, v_cache, g, scale) for g in plan]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.reshape(q.shape)
    out = torch.empty_like(grouped)
    for group in plan:
        out[group.rows] = _attend_group(grouped[group.rows], k_cache, v_cache, group, scale)
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
    skip: list[bool] | None = None,
) -> torch.Tensor:
    """Causal attention of each sequence's last q_len positions over its whole context.

    Earlier context (prefix-cache hits, earlier chunks) is read from the cache
    like the new tokens, which were written there before this call. `skip[b]`:
    sequence b's rows are left unwritten (native_decode's row kernel fills them).
    """
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    starts = cu_seqlens_q.tolist()
    lens = context_lens.tolist()
    gqa = q.shape[1] != k_cache.shape[2]
    for b, ctx in enumerate(lens):
        q_start, q_end = starts[b], starts[b + 1]
        q_len = q_end - q_start
        if q_len == 0 or (skip is not None and skip[b]):
            continue
        num_blocks = -(-ctx // block_size)
        table = block_tables[b : b + 1, :num_blocks]
        # 4-D [1, heads, len, D]: with 3-D inputs the CPU SDPA takes its unfused math path
        keys = _gather(k_cache, table)[:, :ctx].transpose(1, 2).to(q.dtype)  # [1, Hkv, ctx, D]
        values = _gather(v_cache, table)[:, :ctx].transpose(1, 2).to(q.dtype)
        query = q[q_start:q_end].transpose(0, 1)[None]  # [1, H, q_len, D]
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
        out[q_start:q_end] = attn[0].transpose(0, 1)
    return out
