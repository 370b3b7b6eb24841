"""How the batch jobs find the runner (the one the process running them holds), and how
the pages get their book of batches.

On the embedded default it is the gateway's own (its engines, its request path); in a
Celery worker it is the one `services.open_job_runtime` opened for the job (worker
pools). Where there is none, a job can only say so: the lines must run where the
engines are reachable.
"""

from __future__ import annotations

from litestar.di import NamedDependency

from hydrant.platform.batches.book import BatchBook
from hydrant.platform.batches.runner import BatchRunner
from hydrant.platform.db.session import Database
from hydrant.platform.jobs.context import JobContext


def batch_runner(ctx: JobContext) -> BatchRunner | None:
    return ctx.runtime if isinstance(ctx.runtime, BatchRunner) else None


async def provide_batch_book(database: NamedDependency[Database]) -> BatchBook:
    """Batches as the `/ui` pages read them: a tenant its own, an admin every tenant's."""
    return BatchBook(database, tenant_only=False)
