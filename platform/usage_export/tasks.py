"""Thin job wrapper of the usage export: write the closed hours' records, then deliver."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

import httpx

from hydrant.platform.jobs.context import Job, JobContext
from hydrant.platform.usage_export.delivery import ExportTarget, deliver
from hydrant.platform.usage_export.outbox import write_records
from hydrant.platform.usage_export.retention import horizon, purge_delivered
from hydrant.settings import Settings

EXPORT_USAGE = "hydrant.billing.export_usage"
PURGE_USAGE_EXPORT = "hydrant.billing.purge_usage_export"
log = logging.getLogger(__name__)


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
        retention=export_retention(settings),
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


def export_retention(settings: Settings) -> timedelta | None:
    """HYDRANT_USAGE_EXPORT_RETENTION_DAYS as a span; None (0 days): kept forever."""
    days = settings.usage_export_retention_days
    return timedelta(days=days) if days > 0 else None


async def purge_usage_export(ctx: JobContext) -> dict[str, Any]:
    """Delivered records of hours past HYDRANT_USAGE_EXPORT_RETENTION_DAYS: deleted, a
    batch at a time, each batch logged with how far the purge has got."""

    def progress(deleted: int, total: int) -> None:
        log.info("usage export purge", extra={"deleted": deleted, "of": total})

    now = ctx.clock()
    retention = export_retention(ctx.settings)
    deleted = await purge_delivered(ctx.database, now, retention, progress=progress)
    return {"deleted": deleted, "horizon": _iso(horizon(now, retention))}


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


TASKS = (Job(EXPORT_USAGE, export_usage), Job(PURGE_USAGE_EXPORT, purge_usage_export))
