"""The daily reconciliation: computed from the timeline and the ledger, stored by the job,
read by the report.

A day is a UTC day (pools serve every tenant, so no tenant's zone can cut it). The
report reads the job's stored rows when they were computed after the day ended (a
closed day, frozen as the job left it), and computes the day live otherwise (today,
or a day the job has not reached), so it is never staler than the ledger.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import PoolReconciliation, ReconciliationLine
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.reconciliation import repository
from hydrant.platform.reconciliation.identity import PoolDay, TenantLine, cents, reconcile_pool

EARLIEST_DAY = date(2000, 1, 1)


def parse_day(text: str | None, now: datetime) -> date:
    """`YYYY-MM-DD` (UTC); none: today."""
    if not text:
        return now.astimezone(UTC).date()
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise InvalidRequest("day must be a date, YYYY-MM-DD", param="day") from None
    if day < EARLIEST_DAY:
        raise InvalidRequest("day is before 2000-01-01", param="day")
    return day


def oldest_day(now: datetime, retention_days: int) -> date | None:
    """The first UTC day the retention keeps (its rows and timeline); None: all (0 days)."""
    if retention_days <= 0:
        return None
    return now.astimezone(UTC).date() - timedelta(days=retention_days)


def day_bounds(day: date) -> tuple[datetime, datetime]:
    start = datetime.combine(day, time(), UTC)
    return start, start + timedelta(days=1)


@dataclass(frozen=True)
class DayReconciliation:
    day: date
    pools: tuple[PoolDay, ...]
    source: str  # "stored" (the job's rows of a closed day) or "live"
    computed_at: datetime


class ReconciliationService:
    def __init__(
        self,
        session: AsyncSession,
        price: DevicePrice,
        clock: Callable[[], datetime] = utcnow,
        retention_days: int = 0,
    ) -> None:
        self.session = session
        self.price = price
        self.clock = clock
        self.retention_days = retention_days

    def _kept(self, day: date) -> None:
        """A day before the retention's horizon has lost its rows and timeline (or is about
        to): refused (400) rather than reported or stored from what is left of it."""
        first = oldest_day(self.clock(), self.retention_days)
        if first is not None and day < first:
            raise InvalidRequest(
                f"{day.isoformat()} is past the reconciliation's retention of"
                f" {self.retention_days} days (the oldest day kept is {first.isoformat()})",
                param="day",
            )

    async def compute(self, day: date) -> DayReconciliation:
        since, until = day_bounds(day)
        timelines = await repository.intervals_between(self.session, since, until)
        usage = await repository.usage_between(self.session, since, until)
        pools = tuple(
            reconcile_pool(
                model, timelines.get(model, []), usage.get(model, []), self.price, since, until
            )
            for model in sorted({*timelines, *usage})
        )
        return DayReconciliation(day, pools, "live", self.clock())

    async def store(self, day: date) -> DayReconciliation:
        """Compute the day and replace its stored rows (idempotent)."""
        self._kept(day)
        result = await self.compute(day)
        rows = [_pool_row(day, pool, result.computed_at) for pool in result.pools]
        lines = [_line_row(day, pool.model, line) for pool in result.pools for line in pool.lines]
        await repository.replace_day(self.session, day, rows, lines)
        return result

    async def report(self, day: date) -> DayReconciliation:
        self._kept(day)
        _, until = day_bounds(day)
        pools, lines = await repository.stored_day(self.session, day)
        if pools and all(p.computed_at >= until for p in pools):
            return DayReconciliation(
                day,
                tuple(_pool_day(p, [x for x in lines if x.model == p.model]) for p in pools),
                "stored",
                min(p.computed_at for p in pools),
            )
        return await self.compute(day)


def _pool_row(day: date, pool: PoolDay, computed_at: datetime) -> PoolReconciliation:
    return PoolReconciliation(
        day=day,
        model=pool.model,
        price_per_hour=pool.price_per_hour,
        held_seconds=pool.held_seconds,
        load_seconds=pool.seconds["load"],
        ready_seconds=pool.seconds["ready"],
        drain_seconds=pool.seconds["drain"],
        asleep_seconds=pool.seconds["asleep"],
        busy_seconds=pool.busy_seconds,
        held_cost=pool.held_cost,
        request_cost=pool.request_cost,
        idle_cost=pool.idle_cost,
        load_cost=pool.load_cost,
        drain_cost=pool.drain_cost,
        asleep_cost=pool.asleep_cost,
        computed_at=computed_at,
    )


def _line_row(day: date, model: str, line: TenantLine) -> ReconciliationLine:
    return ReconciliationLine(
        day=day,
        model=model,
        tenant_id=line.tenant_id,
        busy_seconds=line.busy_seconds,
        revenue=line.revenue,
        device_cost=line.device_cost,
        idle_cost=line.idle_cost,
    )


def _pool_day(row: PoolReconciliation, lines: list[ReconciliationLine]) -> PoolDay:
    """A stored row as the live computation gives it (cents, as stored to 6 places)."""
    seconds = {
        "load": row.load_seconds,
        "ready": row.ready_seconds,
        "drain": row.drain_seconds,
        "asleep": row.asleep_seconds,
    }
    return PoolDay(
        model=row.model,
        price_per_hour=row.price_per_hour,
        seconds=seconds,
        busy_seconds=row.busy_seconds,
        held_cost=cents(row.held_cost),
        request_cost=cents(row.request_cost),
        idle_cost=cents(row.idle_cost),
        load_cost=cents(row.load_cost),
        drain_cost=cents(row.drain_cost),
        asleep_cost=cents(row.asleep_cost),
        lines=tuple(
            TenantLine(
                tenant_id=x.tenant_id,
                busy_seconds=x.busy_seconds,
                revenue=cents(x.revenue),
                device_cost=cents(x.device_cost),
                idle_cost=cents(x.idle_cost),
            )
            for x in lines
        ),
    )
