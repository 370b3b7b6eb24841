"""Thin job wrapper of the adapters' daily hosting fees (Celery or embedded)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.adapters.hosting import charge_hosting_fees
from hydrant.platform.jobs.context import Job, JobContext

HOSTING_FEES = "hydrant.adapters.hosting_fees"


async def hosting_fees(ctx: JobContext) -> dict[str, Any]:
    return {"entries": await charge_hosting_fees(ctx.database, ctx.clock())}


TASKS = (Job(HOSTING_FEES, hosting_fees),)
