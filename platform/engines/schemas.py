"""The wire shape of `GET /admin/engines` (admin only; no tenant data, no text)."""

from __future__ import annotations

import msgspec


class ObservedLengths(msgspec.Struct, frozen=True, kw_only=True):
    """Prompt and output lengths of the model's most recent ledger entries (p99 by nearest rank)."""

    samples: int
    prompt_mean: float
    output_mean: float
    prompt_p99: int
    output_p99: int


class EngineView(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    state: str
    max_model_len: int
    max_num_seqs: int | None
    block_size: int | None
    num_running: int | None
    num_waiting: int | None
    kv_usage: float | None
    num_free_blocks: int | None
    num_total_blocks: int | None
    observed: ObservedLengths | None
    # The LoRA adapters its engines report loaded now (a pool: any of its workers).
    loaded_adapters: list[str] = []


class EngineList(msgspec.Struct, frozen=True, kw_only=True):
    data: list[EngineView]
