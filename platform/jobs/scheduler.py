"""The embedded default's jobs: the same jobs as Celery's, on the gateway's event loop.

With no Redis there is no broker and no beat; the gateway runs this small
scheduler instead: every `tick_s` it runs each periodic job whose interval has
passed (all of them just after start, so missed work is caught up), and jobs that
others enqueue run as tasks on the same loop. Failures are logged and the
job is tried again at its next turn; the scheduler itself never dies of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.session import Database
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.jobs.registry import JobTable, Periodic
from hydrant.platform.mail.mailer import Mailer, make_mailer
from hydrant.settings import Settings

log = logging.getLogger(__name__)


class EmbeddedScheduler:
    def __init__(
        self,
        settings: Settings,
        database: Database,
        table: JobTable,
        *,
        mailer: Mailer | None = None,
        periodic: tuple[Periodic, ...] | None = None,
        tick_s: float = 15.0,
        first_tick_after_s: float = 5.0,
        clock: Callable[[], datetime] = utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        runtime: object | None = None,
    ) -> None:
        self.context = JobContext(
            settings, database, mailer or make_mailer(settings), self.enqueue, clock, runtime
        )
        self.table = table
        chosen = table.periodic if periodic is None else periodic
        self.periodic = tuple(p for p in chosen if p.embedded)
        self.tick_s = tick_s
        # A moment's grace at start: the gateway's own start-up (price book, engines) and
        # its first requests come first; the catch-up runs right after.
        self.first_tick_after_s = first_tick_after_s
        self._monotonic = monotonic
        self._last_run: dict[str, float] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[Any]] = set()
        self.completed: list[tuple[str, Any]] = []  # (job, result) of recent runs, newest last

    async def start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._loop(), name="embedded-jobs")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop_task = None
        self._running.clear()

    def enqueue(self, name: str, kwargs: dict[str, Any]) -> None:
        """Run job `name` soon, on this loop (what `send_task` is under Celery)."""
        self.table.job_named(name)  # an unknown name fails here, at the caller, not later in a task
        task = asyncio.get_running_loop().create_task(self.run(name, kwargs), name=name)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def run(self, name: str, kwargs: dict[str, Any] | None = None) -> Any:
        """Run one job now; errors are logged (the next turn retries), never raised."""
        job = self.table.job_named(name)
        try:
            result = await job.fn(self.context, **(kwargs or {}))
        except Exception as exc:
            log.warning("job failed", extra={"job": name, "error": type(exc).__name__})
            return None
        self.completed.append((name, result))
        del self.completed[:-100]
        return result

    async def tick(self) -> None:
        """Run every periodic job that is due (each at most once per tick)."""
        now = self._monotonic()
        for entry in self.periodic:
            last = self._last_run.get(entry.name)
            if last is None or now - last >= entry.every_s:
                self._last_run[entry.name] = now
                await self.run(entry.job, dict(entry.kwargs))

    async def idle(self) -> None:
        """Wait until the jobs enqueued so far (and the ones they enqueue) have finished."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def _loop(self) -> None:
        await asyncio.sleep(self.first_tick_after_s)
        while True:
            await self.tick()
            await asyncio.sleep(self.tick_s)
