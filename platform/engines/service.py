"""Engine limits and live state for operators, and the traffic lengths the ledger has seen.

Why the ledger: the question "can `max_num_seqs` sequences ever fit?" depends on
how long sequences really get, and the ledger holds every request's prompt and
output tokens. Only the newest rows are read (bounded), so the call stays cheap
on a large ledger.
"""

from __future__ import annotations

import math

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import LedgerEntry, ModelDeployment
from hydrant.platform.engines.schemas import EngineView, ObservedLengths
from hydrant.platform.models.registry import ModelRegistry, ServedModel

RECENT_ENTRIES = 2000


def summarize_lengths(samples: list[tuple[int, int]]) -> ObservedLengths | None:
    """Mean and p99 (nearest rank, as engine/capacity.py computes it) of (prompt, output) pairs."""
    if not samples:
        return None
    prompts = sorted(p for p, _ in samples)
    outputs = sorted(o for _, o in samples)
    rank = max(math.ceil(0.99 * len(samples)) - 1, 0)
    return ObservedLengths(
        samples=len(samples),
        prompt_mean=sum(prompts) / len(prompts),
        output_mean=sum(outputs) / len(outputs),
        prompt_p99=prompts[rank],
        output_p99=outputs[rank],
    )


async def observed_lengths(
    session: AsyncSession, model: str, limit: int = RECENT_ENTRIES
) -> ObservedLengths | None:
    rows = await session.execute(
        select(LedgerEntry.input_tokens, LedgerEntry.output_tokens)
        .join(ModelDeployment, ModelDeployment.id == LedgerEntry.model_id)
        .where(ModelDeployment.name == model)
        .order_by(LedgerEntry.finished_at.desc())
        .limit(limit)
    )
    return summarize_lengths([(int(p), int(o)) for p, o in rows.all()])


def engine_view(served: ServedModel, observed: ObservedLengths | None) -> EngineView:
    """One model's view; live numbers are None when its client cannot report them."""
    try:
        stats = served.client.stats()
    except Exception:  # a remote pool that cannot answer now: limits still shown
        stats = None
    return EngineView(
        model=served.name,
        state=served.state,
        max_model_len=served.max_model_len,
        max_num_seqs=served.max_num_seqs,
        block_size=served.block_size,
        num_running=stats.num_running if stats else None,
        num_waiting=stats.num_waiting if stats else None,
        kv_usage=stats.kv_usage if stats else None,
        num_free_blocks=stats.num_free_blocks if stats else None,
        num_total_blocks=stats.num_total_blocks if stats else None,
        loaded_adapters=list(stats.loaded_adapters) if stats else [],
        observed=observed,
    )


async def list_engines(session: AsyncSession, registry: ModelRegistry) -> list[EngineView]:
    return [
        engine_view(served, await observed_lengths(session, served.name))
        for served in registry.all()
    ]
