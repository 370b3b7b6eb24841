"""The cost reconciliation's retention: daily rows and the worker timeline older than
`reconciliation_retention_days` are deleted, together, by the hourly purge job.

Together, because the report computes a day live from the timeline when it has no
stored rows: a day with its rows gone but its timeline kept (or the reverse) would be
shown with device-hours that no longer match its revenue. A day before the horizon is
therefore refused by the report and by the job's `store` (service.py), rather than
shown or stored from what is left of it. The timeline's intervals go once they ended
before the horizon's first moment; one that spans it stays whole.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from hydrant.platform.db.base import Base
from hydrant.platform.db.models import PoolReconciliation, ReconciliationLine, WorkerStateInterval
from hydrant.platform.db.purge import Progress, delete_in_batches
from hydrant.platform.db.session import Database
from hydrant.platform.reconciliation.service import day_bounds, oldest_day

DAYS_PER_BATCH = 31


async def purge_expired(
    database: Database,
    now: datetime,
    retention_days: int,
    *,
    progress: Callable[[str], Progress] | None = None,
) -> dict[str, int]:
    """Delete the daily rows of days before the horizon, then the intervals that ended
    before it, a batch per transaction; how many rows of each went. `progress(table)`:
    what hears each table's batches."""
    first = oldest_day(now, retention_days)
    if first is None:
        return {"pool_days": 0, "tenant_lines": 0, "intervals": 0}
    start, _ = day_bounds(first)

    def told(model: type[Base]) -> Progress | None:
        return None if progress is None else progress(model.__tablename__)

    # A day's rows are deleted together, DAYS_PER_BATCH days per transaction.
    line, pool, interval = ReconciliationLine, PoolReconciliation, WorkerStateInterval
    lines = await delete_in_batches(
        database, line, (line.day < first,), by=line.day, batch=DAYS_PER_BATCH, progress=told(line)
    )
    pools = await delete_in_batches(
        database, pool, (pool.day < first,), by=pool.day, batch=DAYS_PER_BATCH, progress=told(pool)
    )
    intervals = await delete_in_batches(
        database, interval, (interval.ended_at < start,), progress=told(interval)
    )
    return {"pool_days": pools, "tenant_lines": lines, "intervals": intervals}
