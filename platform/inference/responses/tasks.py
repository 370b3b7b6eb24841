"""Thin job wrapper of stored responses' retention: delete those past it (Celery or embedded)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.inference.responses.store import purge_expired
from hydrant.platform.jobs.context import Job, JobContext

PURGE_RESPONSES = "hydrant.responses.purge"


async def purge_responses(ctx: JobContext) -> dict[str, Any]:
    """Stored Responses API answers past HYDRANT_RESPONSES_STORE_DAYS: gone, not just unread."""
    return {"deleted": await purge_expired(ctx.database, ctx.clock())}


TASKS = (Job(PURGE_RESPONSES, purge_responses),)
