"""Thin job wrapper of files' retention: delete those past it (Celery or embedded)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.files.deps import file_store
from hydrant.platform.jobs.context import Job, JobContext

PURGE_FILES = "hydrant.files.purge"


async def purge_files(ctx: JobContext) -> dict[str, Any]:
    """Files past HYDRANT_FILES_RETENTION_DAYS (uploads and batch outputs): gone, row and
    content, not just unread."""
    return {"deleted": await file_store(ctx).purge_expired(ctx.clock())}


TASKS = (Job(PURGE_FILES, purge_files),)
