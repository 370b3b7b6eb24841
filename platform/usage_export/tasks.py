"""Thin job wrapper of the usage export: write the closed hours' records, then deliver."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.usage_export.delivery import ExportTarget, deliver
from hydrant.platform.usage_export.outbox import write_records

EXPORT_USAGE = "hydrant.billing.export_usage"


async def export_usage(ctx: JobContext) -> dict[str, Any]:
    """One run: records for the hours closed since the last one, then every due record."""
    settings = ctx.settings
    target = ExportTarget.from_settings(settings)
    if target is None:
        return {"enabled": False}
    written = await write_records(
        ctx.database,
        ctx.clock(),
        settle=timedelta(seconds=settings.usage_export_settle_s),
        lookback=timedelta(hours=settings.usage_export_lookback_hours),
    )
    async with httpx.AsyncClient(timeout=target.timeout_s) as client:
        report = await deliver(ctx.database, target, client, ctx.clock)
    return {
        "written": written,
        "due": report.due,
        "sent": report.sent,
        "failed": report.failed,
        "waiting": report.waiting,
    }


TASKS = (Job(EXPORT_USAGE, export_usage),)
