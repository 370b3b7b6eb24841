"""Where a step's tokens live in the paged KV cache: the metadata passed through the model.

The attention itself is the kernel backend's (`hydrant.kernels.backends`);
this module only lays a step out the way every backend reads it, so the
model runner and the accuracy gates (`engine/accuracy/scoring.py`) build it
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import torch

from hydrant.engine.block_table import block_rows
from hydrant.kernels.table import DecodePlan

DecodePlanner = Callable[[list[list[int]], list[int]], DecodePlan]


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
    decode_plan: DecodePlan | None = None  # a `planned_decode` backend's per-step gather plan

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_context_lens.shape[0])


def build_metadata(
    slots: list[int],
    decode_tables: list[list[int]],
    decode_lens: list[int],
    prefill_tables: list[list[int]],
    prefill_lens: list[int],
    cu_seqlens_q: list[int],
    block_size: int,
    device: torch.device,
    planner: DecodePlanner | None = None,
) -> AttentionMetadata:
    """A step's metadata from host lists: decodes' tables and context lengths, then the
    prefill chunks' (with `cu_seqlens_q`, starting at 0); `planner` (the backend's, when
    it plans decode) builds the decode plan."""

    def tensor(values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        if not values and dtype == torch.int32:  # a decode-only step's prefill lengths, ...
            return _zeros(device, (0,))
        return torch.tensor(values, dtype=dtype, device=device)

    def table(tables: list[list[int]], lens: list[int]) -> torch.Tensor:
        """Block tables cut to the blocks the contexts use, padded with block 0 (masked)."""
        if not tables:
            return _zeros(device, (0, 1))
        width = -(-max(lens) // block_size)
        return torch.from_numpy(block_rows(tables, width)).to(device)

    cu = _zeros(device, (1,)) if cu_seqlens_q == [0] else tensor(cu_seqlens_q, torch.int32)
    return AttentionMetadata(
        slot_mapping=tensor(slots, torch.long),
        num_decode_tokens=len(decode_lens),
        decode_block_tables=table(decode_tables, decode_lens),
        decode_context_lens=tensor(decode_lens, torch.int32),
        prefill_block_tables=table(prefill_tables, prefill_lens),
        prefill_cu_seqlens_q=cu,
        prefill_context_lens=tensor(prefill_lens, torch.int32),
        prefill_max_q_len=max((b - a for a, b in pairwise(cu_seqlens_q)), default=0),
        decode_plan=(
            planner(decode_tables, decode_lens) if decode_lens and planner is not None else None
        ),
    )


_ZEROS: dict[tuple[torch.device, tuple[int, ...]], torch.Tensor] = {}


def _zeros(device: torch.device, shape: tuple[int, ...]) -> torch.Tensor:
    """An int32 zero tensor made once per device and shape: the parts a step without
    prefills (or without decodes) leaves empty, `[]` lengths, a `[0, 1]` table, `[0]`
    cumulative lengths.

    Each would otherwise be a tensor creation, and on a GPU a copy, every step; kernels
    only read metadata, so one instance serves every step.
    """
    key = (torch.device(device), shape)
    cached = _ZEROS.get(key)
    if cached is None:
        cached = _ZEROS[key] = torch.zeros(shape, dtype=torch.int32, device=device)
    return cached
