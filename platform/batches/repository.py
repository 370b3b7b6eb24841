"""Queries on batches and their lines. Readers see what `auth.scoping` lets them (the
book passes its scoping in); the runner (a system actor) works one batch by id, under
the lease it claimed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, and_, delete, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.batches.reservation import HeldState
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.batch_models import Batch, BatchLine
from hydrant.platform.db.models import DEFAULT_PLAN_ID, ApiKey, LedgerEntry, Plan, Tenant
from hydrant.platform.db.pagination import page_after
from hydrant.platform.reports.repository import exact_sum

# Batches whose lines may still run (and whose prompt tokens count against the queue limit).
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")
# Batches a runner has work on: lines to run, or a final status to reach.
WORKABLE = ("in_progress", "finalizing", "cancelling")
# A batch still `validating` this long after it was written had its creation cut short
# (its gateway died between writing it and holding its reservation): a runner fails it
# and gives back whatever it may hold. Creation takes well under a second past that point.
CREATION_GRACE = timedelta(minutes=5)


def _workable(now: datetime) -> Any:
    return or_(
        Batch.status.in_(WORKABLE),
        and_(Batch.status == "validating", Batch.created_at < now - CREATION_GRACE),
    )


# How a reader's statements are restricted to what it may see (`BatchBook._visible`).
Visible = Callable[[Select[Any], Principal], Select[Any]]


async def one_batch(
    session: AsyncSession, visible: Visible, principal: Principal, batch_id: str
) -> Batch | None:
    return await session.scalar(visible(select(Batch).where(Batch.id == batch_id), principal))


async def page_of_batches(
    session: AsyncSession,
    visible: Visible,
    principal: Principal,
    *,
    limit: int,
    after: str | None,
    tenant_id: str | None = None,
    status: str | None = None,
) -> tuple[Sequence[Batch], bool]:
    """Newest first, as OpenAI lists batches."""
    statement = select(Batch)
    if tenant_id is not None:
        statement = statement.where(Batch.tenant_id == tenant_id)
    if status is not None:
        statement = statement.where(Batch.status == status)
    return await page_after(
        session,
        visible(statement, principal),
        Batch,
        limit=limit,
        after=after,
        cursor_scope=visible(select(Batch.created_at), principal),
        descending=True,
    )


async def charged(session: AsyncSession, batch_ids: Sequence[str]) -> dict[str, Decimal]:
    """The sum of each batch's ledger entries (exact on both databases); 0 for none."""
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    statement = (
        select(LedgerEntry.batch_id, exact_sum(dialect, LedgerEntry.charged, STORAGE_PLACES))
        .where(LedgerEntry.batch_id.in_(batch_ids))
        .group_by(LedgerEntry.batch_id)
    )
    sums = {batch_id: Decimal(0) for batch_id in batch_ids}
    for batch_id, total in (await session.execute(statement)).all():
        if dialect == "postgresql":
            sums[batch_id] = Decimal(total)
        else:  # summed as integer micro-units (reports.repository.exact_sum)
            sums[batch_id] = Decimal(int(total)).scaleb(-STORAGE_PLACES)
    return sums


async def enqueued_tokens(session: AsyncSession, tenant_id: str, model: str) -> int:
    """Prompt tokens of the tenant's unfinished batches of `model` not yet run."""
    total = await session.scalar(
        select(func.coalesce(func.sum(Batch.enqueued_tokens), 0)).where(
            Batch.tenant_id == tenant_id, Batch.model == model, Batch.status.in_(UNFINISHED)
        )
    )
    return int(total or 0)


async def lock_tenant(session: AsyncSession, tenant_id: str) -> None:
    """Hold the tenant's row until the transaction ends (PostgreSQL; SQLite has one writer
    at a time anyway): concurrent batch creates of one tenant check its queue in turn."""
    await session.execute(select(Tenant.id).where(Tenant.id == tenant_id).with_for_update())


async def tenant_and_plan(session: AsyncSession, tenant_id: str) -> tuple[Tenant, Plan] | None:
    """A batch's tenant and the plan its lines run under (the default when it has none)."""
    statement = (
        select(Tenant, Plan)
        .join(Plan, Plan.id == func.coalesce(Tenant.plan_id, DEFAULT_PLAN_ID))
        .where(Tenant.id == tenant_id)
    )
    row = (await session.execute(statement)).first()
    return None if row is None else (row[0], row[1])


async def key_project(session: AsyncSession, key_id: str | None) -> str | None:
    """The project of the key that made a batch (its lines' ledger entries name it)."""
    if key_id is None:
        return None
    return await session.scalar(select(ApiKey.project_id).where(ApiKey.id == key_id))


async def claim(
    session: AsyncSession, batch_id: str, owner: str, now: datetime, lease: timedelta
) -> bool:
    """Take (or renew) the batch's lease: free, lapsed, or already ours. One runner at a time."""
    result = await session.execute(
        update(Batch)
        .where(
            Batch.id == batch_id,
            _workable(now),
            or_(Batch.lease_until.is_(None), Batch.lease_until < now, Batch.lease_owner == owner),
        )
        .values(lease_owner=owner, lease_until=now + lease)
    )
    return bool(getattr(result, "rowcount", 0))


async def start(
    session: AsyncSession, batch_id: str, now: datetime, reservation: dict[str, Any] | None
) -> bool:
    """A made batch's `validating` → `in_progress`, with the reservation as admitted; False
    if it is no longer validating (the sweep failed it as a creation cut short)."""
    result = await session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.status == "validating")
        .values(status="in_progress", in_progress_at=now, reservation=reservation)
    )
    return bool(getattr(result, "rowcount", 0))


async def forget_unstarted(session: AsyncSession, batch_id: str) -> None:
    """A batch refused after it was written (its reservation did not fit): never made."""
    await session.execute(delete(Batch).where(Batch.id == batch_id, Batch.status == "validating"))


async def release(session: AsyncSession, batch_id: str, owner: str) -> None:
    await session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.lease_owner == owner)
        .values(lease_owner=None, lease_until=None)
    )


async def unleased(session: AsyncSession, now: datetime, limit: int = 100) -> list[str]:
    """Batches with work and no live runner: never started, or their runner died (or
    their creation was cut short)."""
    statement = (
        select(Batch.id)
        .where(_workable(now), or_(Batch.lease_until.is_(None), Batch.lease_until < now))
        .order_by(Batch.created_at)
        .limit(limit)
    )
    return list((await session.scalars(statement)).all())


async def done_lines(session: AsyncSession, batch_id: str) -> set[int]:
    statement = select(BatchLine.line).where(BatchLine.batch_id == batch_id)
    return set((await session.scalars(statement)).all())


async def finished_lines(session: AsyncSession, batch_id: str) -> Sequence[BatchLine]:
    statement = select(BatchLine).where(BatchLine.batch_id == batch_id).order_by(BatchLine.line)
    return (await session.scalars(statement)).all()


async def count_line(
    session: AsyncSession,
    batch_id: str,
    *,
    ok: bool,
    prompt_tokens: int,
    usage: tuple[int, int, int],
    share: tuple[int, int],
    spent_micros: int,
) -> HeldState:
    """A stored line counts: completed or failed, its tokens, no longer enqueued; its
    `share` (tokens, micro-units) of the reservation no longer held, what it used spent.
    Returns the reservation's state after it (the row is locked until the commit, so
    each line's state is the one its version names)."""
    input_tokens, cached_tokens, output_tokens = usage
    share_tokens, share_micros = share
    values: dict[str, Any] = {
        "input_tokens": Batch.input_tokens + input_tokens,
        "cached_tokens": Batch.cached_tokens + cached_tokens,
        "output_tokens": Batch.output_tokens + output_tokens,
        "enqueued_tokens": _at_least_0(session, Batch.enqueued_tokens - prompt_tokens),
        "held_tokens": _at_least_0(session, Batch.held_tokens - share_tokens),
        "held_micros": _at_least_0(session, Batch.held_micros - share_micros),
        "spent_micros": Batch.spent_micros + spent_micros,
        "quota_version": Batch.quota_version + 1,
    }
    if ok:
        values["request_completed"] = Batch.request_completed + 1
    else:
        values["request_failed"] = Batch.request_failed + 1
    statement = (
        update(Batch)
        .where(Batch.id == batch_id)
        .values(**values)
        .returning(
            Batch.quota_version,
            Batch.held_tokens,
            Batch.held_micros,
            Batch.input_tokens + Batch.output_tokens,
            Batch.spent_micros,
        )
    )
    row = (await session.execute(statement)).one()
    return HeldState(*(int(value) for value in row))


def _at_least_0(session: AsyncSession, value: Any) -> Any:
    if session.bind is not None and session.bind.dialect.name == "sqlite":
        return func.max(value, 0)
    return func.greatest(value, 0)


async def status_of(session: AsyncSession, batch_id: str) -> tuple[str, datetime] | None:
    """A batch's status and the end of its window, as they are now."""
    row = (
        await session.execute(select(Batch.status, Batch.expires_at).where(Batch.id == batch_id))
    ).first()
    return None if row is None else (row[0], row[1])
