"""The Celery app, made from settings by `make_celery` (nothing is configured at import).

Each registered task runs its job on a fresh event loop with its own
connection pool (`asyncio.run`), so tasks are independent of the pool type
(prefork, threads, solo). Tasks are acknowledged late and rejected when the
worker is lost: a task whose worker dies is delivered again, which is safe
because every job is idempotent (digests and alerts are claimed in the
database before they are mailed).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from celery import Celery, Task

from hydrant.errors import ConfigurationError
from hydrant.platform.jobs.context import Job, RuntimeFactory, open_job_context
from hydrant.platform.jobs.registry import JobTable
from hydrant.platform.mail.mailer import Mailer
from hydrant.settings import Settings

log = logging.getLogger(__name__)

MAX_RETRIES = 5
NO_REDIS = (
    "the Celery worker and beat need Redis: set HYDRANT_REDIS_URL (e.g. redis://localhost:6379/0)."
    " On the embedded default (no Redis) `hydrant serve` runs these jobs itself."
)


def make_celery(
    settings: Settings,
    table: JobTable,
    *,
    mailer: Mailer | None = None,
    runtime: RuntimeFactory | None = None,
) -> Celery:
    """The app for `settings`, with every job of `table` registered and its beat schedule set.
    `runtime` opens what a job that needs it (`Job.runtime`) runs with, once per run."""
    if not settings.redis_url:
        raise ConfigurationError(NO_REDIS)
    app = Celery("hydrant", set_as_current=False)
    app.conf.update(
        broker_url=settings.redis_url,
        result_backend=settings.redis_url,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,  # logging is hydrant's (redacted, one handler)
        result_expires=timedelta(days=1),
        timezone="UTC",
        enable_utc=True,
        beat_schedule={
            p.name: {
                "task": p.job,
                "schedule": timedelta(seconds=p.every_s),
                "kwargs": dict(p.kwargs),
            }
            for p in table.periodic
        },
    )

    def enqueue(name: str, kwargs: dict[str, Any]) -> None:
        app.send_task(name, kwargs=kwargs)

    for job in table.jobs.values():
        _register(app, settings, job, enqueue, mailer, runtime)
    return app


def _register(
    app: Celery,
    settings: Settings,
    job: Job,
    enqueue: Any,
    mailer: Mailer | None,
    runtime: RuntimeFactory | None,
) -> None:
    async def run_once(kwargs: dict[str, Any]) -> Any:
        async with open_job_context(settings, enqueue, mailer=mailer) as ctx:
            if not (job.runtime and runtime is not None):
                return await job.fn(ctx, **kwargs)
            async with runtime(ctx) as opened:
                ctx.runtime = opened
                return await job.fn(ctx, **kwargs)

    def run(task: Task, **kwargs: Any) -> Any:
        try:
            return asyncio.run(run_once(kwargs))
        except job.retry_on as exc:
            retries = task.request.retries
            log.warning(
                "job failed; retrying",
                extra={"job": job.name, "error": type(exc).__name__, "retries": retries},
            )
            raise task.retry(exc=exc, countdown=min(300, 5 * 2**retries)) from None

    run.__name__ = run.__qualname__ = job.name.replace(".", "_")
    # shared=False: a shared task would be added to every Celery app made later in this
    # process, with this app's settings in its closure.
    app.task(name=job.name, bind=True, max_retries=MAX_RETRIES, shared=False)(run)
