"""Thin job wrapper: store the daily reconciliation rows (hourly; idempotent per day)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from hydrant.platform.db.purge import Progress
from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.reconciliation.deps import reconciliation_service
from hydrant.platform.reconciliation.retention import purge_expired
from hydrant.platform.reconciliation.service import oldest_day, parse_day

log = logging.getLogger(__name__)

RECONCILE = "hydrant.billing.reconcile"
PURGE_RECONCILIATION = "hydrant.billing.purge_reconciliation"


async def reconcile_days(ctx: JobContext, day: str | None = None) -> dict[str, Any]:
    """Store `day`, or yesterday and today (UTC): yesterday again after midnight so its
    last hour and late ledger entries are in the rows that freeze it."""
    today = parse_day(None, ctx.clock())
    days = [parse_day(day, ctx.clock())] if day else [today - timedelta(days=1), today]
    stored: dict[str, Any] = {}
    for index, each in enumerate(days, start=1):
        async with ctx.database.session() as session:
            result = await reconciliation_service(session, ctx.settings, ctx.clock).store(each)
        balanced = all(p.balances for p in result.pools)
        stored[each.isoformat()] = {"pools": len(result.pools), "balanced": balanced}
        log.info("reconciliation stored", extra={"day": each.isoformat(), "done": index})
    return stored


async def purge_reconciliation(ctx: JobContext) -> dict[str, Any]:
    """Daily rows and worker timeline older than HYDRANT_RECONCILIATION_RETENTION_DAYS:
    deleted, a batch at a time, each batch logged with how far its table has got."""

    def progress(table: str) -> Progress:
        def told(deleted: int, total: int) -> None:
            log.info(
                "reconciliation purge", extra={"table": table, "deleted": deleted, "of": total}
            )

        return told

    now = ctx.clock()
    days = ctx.settings.reconciliation_retention_days
    deleted = await purge_expired(ctx.database, now, days, progress=progress)
    first = oldest_day(now, days)
    return {**deleted, "oldest_day": None if first is None else first.isoformat()}


TASKS = (Job(RECONCILE, reconcile_days), Job(PURGE_RECONCILIATION, purge_reconciliation))
