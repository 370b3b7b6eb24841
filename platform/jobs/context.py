"""What a job runs with: settings, a database, a mailer and a way to enqueue more jobs.

It names no domain: each domain's `tasks.py` builds its services from the
context through the same providers its controllers use (e.g.
`digests/deps.py`), so `jobs` sits below every domain that has jobs.

The same `JobContext` serves a Celery worker (its own pool per task run,
since each task runs its own event loop) and the embedded scheduler (the
gateway's pool, on the gateway's loop); jobs are plain async functions of it,
so both runners call exactly the same code.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.jobs.after_commit import Enqueue
from hydrant.platform.mail.mailer import Mailer, MailError, make_mailer
from hydrant.platform.server_secret import load_server_secret
from hydrant.settings import Settings

# Failures worth retrying later: the mail server or the database was not there.
RETRYABLE: tuple[type[BaseException], ...] = (MailError, *DATABASE_UNAVAILABLE)


@dataclass
class JobContext:
    settings: Settings
    database: Database
    mailer: Mailer
    enqueue: Enqueue
    clock: Callable[[], datetime] = utcnow
    # What the process running the job holds for the jobs that need more than the database
    # (`Job.runtime`): on the embedded loop the gateway's batch runner, in a Celery worker
    # what `make_celery`'s runtime factory opened for the job; None where there is none.
    runtime: object | None = None

    @cached_property
    def server_secret(self) -> bytes:
        """Read once per context: the embedded scheduler's context lives as long as the gateway."""
        return load_server_secret(self.settings)


JobFn = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Job:
    """A named job: `fn(ctx, **kwargs)`; kwargs are JSON values (they cross Redis).
    `runtime`: it needs `ctx.runtime` (a Celery worker opens one for it)."""

    name: str
    fn: JobFn
    retry_on: tuple[type[BaseException], ...] = field(default=RETRYABLE)
    runtime: bool = False


# Opens what `ctx.runtime` holds for one run of a job that needs it (None: nothing here).
RuntimeFactory = Callable[[JobContext], AbstractAsyncContextManager[object | None]]


@asynccontextmanager
async def open_job_context(
    settings: Settings, enqueue: Enqueue, *, mailer: Mailer | None = None
) -> AsyncIterator[JobContext]:
    """A context with its own connection pool, for one job run on its own event loop."""
    database = Database(settings.effective_database_url)
    try:
        yield JobContext(settings, database, mailer or make_mailer(settings), enqueue)
    finally:
        await database.dispose()
