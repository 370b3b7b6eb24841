"""Queries of the reconciliation: the worker timeline's writes and reads, the ledger's
per-pool sums of a day, and the daily rows the job stores."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, date, datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.models import (
    LedgerEntry,
    ModelDeployment,
    PoolReconciliation,
    ReconciliationLine,
    WorkerStateInterval,
)
from hydrant.platform.reconciliation.identity import STATE_KIND, Interval, TenantUsage
from hydrant.platform.reports.repository import SECONDS_PLACES, exact_sum, exact_value

_TABLE = WorkerStateInterval.__table__


def _dialect(session: AsyncSession) -> str:
    return session.bind.dialect.name if session.bind is not None else "sqlite"


def _moment(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


async def record_states(session: AsyncSession, records: Sequence[WorkerRecord]) -> int:
    """Write what the registry shows into the timeline; how many workers were recorded.

    Each statement only ever moves an interval's end later, and intervals are keyed by
    the worker's own stamp of its state change, so any number of gateways may record the
    same records in any order and leave the same rows (recorder.py states the rule).
    """
    module = postgresql if _dialect(session) == "postgresql" else sqlite
    written = 0
    for record in records:
        if record.kind != "hydrant" or record.state not in STATE_KIND:
            continue  # upstream servers' devices are their deployment's, not priced here
        since = _moment(record.state_since or record.started_at)
        seen = max(since, _moment(record.heartbeat_at))
        key = (
            (WorkerStateInterval.worker_id == record.worker_id)
            & (WorkerStateInterval.state == record.state)
            & (WorkerStateInterval.started_at == since)
        )
        await session.execute(
            module.insert(_TABLE)
            .values(
                worker_id=record.worker_id,
                model=record.model,
                device=record.device[:64],
                state=record.state,
                started_at=since,
                ended_at=seen,
            )
            .on_conflict_do_nothing(index_elements=["worker_id", "state", "started_at"])
        )
        await session.execute(
            update(WorkerStateInterval)
            .where(key, WorkerStateInterval.ended_at < seen)
            .values(ended_at=seen)
        )
        # A worker first seen past its start was loading from `started_at` (its first
        # state, stamped at the same moment): a row that is already there stays as it is.
        if record.started_at and _moment(record.started_at) < since:
            await session.execute(
                module.insert(_TABLE)
                .values(
                    worker_id=record.worker_id,
                    model=record.model,
                    device=record.device[:64],
                    state="starting",
                    started_at=_moment(record.started_at),
                    ended_at=since,
                )
                .on_conflict_do_nothing(index_elements=["worker_id", "state", "started_at"])
            )
        # The state before this one lasted until this one began: exactly, so a row that a
        # late (older) record stretched too far is cut back to where this state began.
        earlier = aliased(WorkerStateInterval)  # not correlated with the UPDATE's table
        previous = (
            select(func.max(earlier.started_at))
            .where(earlier.worker_id == record.worker_id, earlier.started_at < since)
            .scalar_subquery()
        )
        await session.execute(
            update(WorkerStateInterval)
            .where(
                WorkerStateInterval.worker_id == record.worker_id,
                WorkerStateInterval.started_at == previous,
                WorkerStateInterval.ended_at != since,
            )
            .values(ended_at=since)
        )
        written += 1
    return written


async def intervals_between(
    session: AsyncSession, since: datetime, until: datetime
) -> dict[str, list[Interval]]:
    """Every pool's intervals that overlap [since, until), by model."""
    rows = await session.execute(
        select(WorkerStateInterval).where(
            WorkerStateInterval.started_at < until, WorkerStateInterval.ended_at > since
        )
    )
    pools: dict[str, list[Interval]] = defaultdict(list)
    for row in rows.scalars():
        pools[row.model].append(Interval(row.worker_id, row.state, row.started_at, row.ended_at))
    return dict(pools)


async def usage_between(
    session: AsyncSession, since: datetime, until: datetime
) -> dict[str, list[TenantUsage]]:
    """Each pool's (base model's: an adapter's requests ran on its device) ledger sums per
    tenant over entries finished in [since, until), exact as the reports sum them."""
    dialect = _dialect(session)
    statement = (
        select(
            ModelDeployment.name,
            LedgerEntry.tenant_id,
            exact_sum(dialect, LedgerEntry.charged, STORAGE_PLACES),
            exact_sum(dialect, LedgerEntry.device_cost, STORAGE_PLACES),
            exact_sum(dialect, LedgerEntry.device_seconds, SECONDS_PLACES),
        )
        .join(ModelDeployment, ModelDeployment.id == LedgerEntry.model_id)
        .where(LedgerEntry.finished_at >= since, LedgerEntry.finished_at < until)
        .group_by(ModelDeployment.name, LedgerEntry.tenant_id)
        .order_by(ModelDeployment.name, LedgerEntry.tenant_id)
    )
    pools: dict[str, list[TenantUsage]] = defaultdict(list)
    for model, tenant_id, charged, cost, seconds in (await session.execute(statement)).all():
        pools[model].append(
            TenantUsage(
                tenant_id=tenant_id,
                revenue=exact_value(charged, dialect, STORAGE_PLACES),
                device_cost=exact_value(cost, dialect, STORAGE_PLACES),
                busy_seconds=exact_value(seconds, dialect, SECONDS_PLACES),
            )
        )
    return dict(pools)


async def replace_day(
    session: AsyncSession,
    day: date,
    pools: Sequence[PoolReconciliation],
    lines: Sequence[ReconciliationLine],
) -> None:
    """The day's rows, replaced whole (the job is idempotent: a rerun rewrites the same)."""
    await session.execute(delete(ReconciliationLine).where(ReconciliationLine.day == day))
    await session.execute(delete(PoolReconciliation).where(PoolReconciliation.day == day))
    session.add_all([*pools, *lines])
    await session.flush()


async def stored_day(
    session: AsyncSession, day: date
) -> tuple[list[PoolReconciliation], list[ReconciliationLine]]:
    pools = await session.execute(
        select(PoolReconciliation)
        .where(PoolReconciliation.day == day)
        .order_by(PoolReconciliation.model)
    )
    lines = await session.execute(
        select(ReconciliationLine)
        .where(ReconciliationLine.day == day)
        .order_by(ReconciliationLine.model, ReconciliationLine.tenant_id)
    )
    return list(pools.scalars()), list(lines.scalars())
