"""Thin job wrapper of the reports' hourly rollups (Celery or embedded)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.reports.rollups import rollup_recent

ROLLUP = "hydrant.ledger.rollup"


async def rollup_ledger(ctx: JobContext, hours: int | str = 3) -> dict[str, Any]:
    return {"rows": await rollup_recent(ctx.database, ctx.clock(), int(hours))}


TASKS = (Job(ROLLUP, rollup_ledger),)
