"""Thin job wrapper: pay every tenant's pending ledger entries from its credits."""

from __future__ import annotations

from typing import Any

from hydrant.platform.credits.payer import pay_all_pending
from hydrant.platform.jobs.context import Job, JobContext

PAY_PENDING = "hydrant.credits.pay_pending"


async def pay_pending_entries(ctx: JobContext) -> dict[str, Any]:
    report = await pay_all_pending(ctx.database, ctx.clock())
    return {"tenants": report.tenants, "entries": report.entries, "failed": len(report.failed)}


TASKS = (Job(PAY_PENDING, pay_pending_entries),)
