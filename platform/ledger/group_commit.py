"""Group commit: concurrent ledger writes share one transaction.

Every request waits for its entry to be durable before its response is
complete (a 200 whose entry could be lost in a crash would be served
unmetered), so a commit per request caps the gateway at the database's
round-trip rate. Entries that arrive while a flush is in progress go into
the next flush together; each caller still learns whether its own entry landed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Flush = Callable[[list[dict[str, Any]]], Awaitable[None]]


def _consume(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a caller that timed out has moved on; the error is not lost


class GroupCommit:
    def __init__(self, flush: Flush, max_batch: int = 256) -> None:
        self._flush = flush
        self.max_batch = max_batch
        self._pending: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None

    def submit(self, raw: dict[str, Any]) -> asyncio.Future[None]:
        """Queue `raw`; the future resolves when its flush commits (or fails with its error)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_consume)
        self._pending.append((raw, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain(), name="ledger-group-commit")
        return future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            error: BaseException | None = None
            try:
                await self._flush([raw for raw, _ in batch])
            except Exception as exc:
                error = exc
            for _, future in batch:
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
