"""Thin job wrapper: store the daily reconciliation rows (hourly; idempotent per day)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.reconciliation.deps import reconciliation_service
from hydrant.platform.reconciliation.service import parse_day

log = logging.getLogger(__name__)

RECONCILE = "hydrant.billing.reconcile"


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


TASKS = (Job(RECONCILE, reconcile_days),)
