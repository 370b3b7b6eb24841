"""Thin job wrapper of files' retention: delete those past it, and the volume's blobs no
row names (Celery or embedded)."""

from __future__ import annotations

from typing import Any

from hydrant.platform.files.deps import file_store
from hydrant.platform.jobs.context import Job, JobContext

PURGE_FILES = "hydrant.files.purge"


async def purge_files(ctx: JobContext) -> dict[str, Any]:
    """Files past their expiry (HYDRANT_FILES_RETENTION_DAYS, or a batch's
    `output_expires_after`): gone, row and content, not just unread; then blobs left on
    the files volume without a row (`FileStore.sweep_orphans`)."""
    store = file_store(ctx)
    now = ctx.clock()
    deleted = await store.purge_expired(now)
    return {"deleted": deleted, "orphans_removed": await store.sweep_orphans(now)}


TASKS = (Job(PURGE_FILES, purge_files),)
