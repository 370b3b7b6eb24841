"""An in-memory copy of a table, reloaded on a timer: the price book, the adapter catalog.

Why a copy: they are read on every request, and a query per request would put the
database on the request path. Why one loop: both must keep their last known rows when a
reload fails (the database away for a moment must not turn prices or adapters off), and
both must stop cleanly with the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)


class RefreshedCopy:
    """Subclasses implement `refresh` (load the rows) and set `refresh_s` and `copy_name`."""

    refresh_s: float
    copy_name: str
    _task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        raise NotImplementedError

    def _can_refresh(self) -> bool:
        return True

    def start(self) -> None:
        if self._task is None and self._can_refresh():
            self._task = asyncio.create_task(self._loop(), name=f"{self.copy_name}-refresh")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.refresh()
            except Exception as exc:  # keep the last known rows while the database is away
                log.warning(
                    "%s refresh failed", self.copy_name, extra={"error": type(exc).__name__}
                )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
