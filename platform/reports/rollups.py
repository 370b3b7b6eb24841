"""Hourly ledger rollups: the reports' hourly aggregate, stored per (hour, tenant, model),
with the Batch API's part of it (`batch_requests`, `batch_charged`) beside the totals.

Each run rewrites the last few hours whole (delete, then insert, in one
transaction), so running it twice, or late, gives the same rows, and entries
that arrive late (replayed from a gateway's spool) are counted on the next run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import delete

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.models import LedgerHourlyRollup
from hydrant.platform.db.session import Database
from hydrant.platform.reports import repository as reports
from hydrant.platform.reports.query import ReportQuery


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


async def rollup_hours(database: Database, since: datetime, until: datetime) -> int:
    """Rewrite the rollups of the whole hours in `[since, until)`; returns the rows written."""
    since, until = hour_floor(since), hour_floor(until)
    async with database.session() as session:
        rows = await reports.aggregate(
            session, CONSOLE, ReportQuery(since=since, until=until, group_by="hour")
        )
        await session.execute(
            delete(LedgerHourlyRollup).where(
                LedgerHourlyRollup.hour >= since, LedgerHourlyRollup.hour < until
            )
        )
        session.add_all(
            LedgerHourlyRollup(
                hour=r.bucket,
                tenant_id=r.tenant_id,
                model=r.model,
                requests=r.requests,
                input_tokens=r.input_tokens,
                cached_tokens=r.cached_tokens,
                output_tokens=r.output_tokens,
                charged=r.charged,
                device_seconds=r.device_seconds,
                device_cost=r.device_cost,
                batch_requests=r.batch_requests,
                batch_charged=r.batch_charged,
            )
            for r in rows
        )
    return len(rows)


async def rollup_recent(database: Database, now: datetime, hours: int = 3) -> int:
    """The last `hours` whole hours and the current one, up to the next hour."""
    until = hour_floor(now) + timedelta(hours=1)
    return await rollup_hours(database, until - timedelta(hours=hours + 1), until)
