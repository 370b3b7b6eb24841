"""How the file store is made: one place for the gateway's services, the jobs and the CLI,
so all of them seal under the same key and keep files in the same place."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from hydrant.platform.db.session import Database
from hydrant.platform.files.service import FileLimits, FileStore
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.sealing import Sealer
from hydrant.settings import Settings

_LABEL = "hydrant-files:seal"
_KIND = b"hydrant-file"


def build_file_store(
    settings: Settings, database: Database, server_secret: Callable[[], bytes]
) -> FileStore:
    limits = FileLimits(
        max_bytes=settings.files_max_bytes,
        max_lines=settings.files_max_lines,
        retention=timedelta(days=max(settings.files_retention_days, 0)),
    )
    sealer = Sealer(server_secret, label=_LABEL, kind=_KIND)
    return FileStore(database, sealer, limits, settings.files_dir)


def file_store(ctx: JobContext) -> FileStore:
    """The store a job uses (its context's database and server secret)."""
    return build_file_store(ctx.settings, ctx.database, lambda: ctx.server_secret)
