"""`unless_client_leaves`: a handler's work is stopped when its client disconnects, and only
then; its own cleanup runs to its end before the 499 is raised."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hydrant.platform.errors import ClientDisconnected
from hydrant.platform.http.disconnect import unless_client_leaves


class Connection:
    """An ASGI `receive` whose client leaves when told (after the body was read, `receive`
    only ever reports the disconnect)."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.calls = 0

    async def receive(self) -> dict[str, Any]:
        self.calls += 1
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_the_work_answers_when_the_client_stays() -> None:
    connection = Connection()

    async def work() -> str:
        await asyncio.sleep(0.01)
        return "answer"

    assert await unless_client_leaves(connection.receive, work()) == "answer"
    assert connection.calls == 1  # the listener was started, and is gone now


async def test_a_client_that_leaves_stops_the_work_after_its_cleanup() -> None:
    connection = Connection()
    cleaned: list[str] = []
    started = asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(60)  # a long generation
            return "never"
        finally:
            await asyncio.sleep(0.01)  # e.g. the ledger entry of what was generated
            cleaned.append("done")

    async def leave() -> None:
        await started.wait()
        connection.gone.set()

    leaving = asyncio.create_task(leave())
    with pytest.raises(ClientDisconnected) as raised:
        await asyncio.wait_for(unless_client_leaves(connection.receive, work()), 5)
    await leaving
    assert cleaned == ["done"]  # the cleanup ran before the 499
    assert raised.value.status == 499


async def test_an_error_of_the_work_is_its_own_not_a_disconnect() -> None:
    connection = Connection()

    async def work() -> str:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await unless_client_leaves(connection.receive, work())


async def test_a_handler_cancelled_from_outside_cancels_its_work() -> None:
    connection = Connection()
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    handler = asyncio.create_task(unless_client_leaves(connection.receive, work()))
    await asyncio.sleep(0.01)
    handler.cancel()
    with pytest.raises(asyncio.CancelledError):  # its own cancellation, not a 499
        await handler
    assert cancelled.is_set()


async def test_a_disconnect_seen_as_the_work_ends_cancels_nothing_after_it() -> None:
    """The listener can finish in the loop pass where the work ends: its callback is queued
    then, and runs after this returned; it must not cancel whatever the task does next."""
    connection = Connection()

    async def work() -> str:
        connection.gone.set()  # the listener, not started yet, will find the client gone
        await asyncio.sleep(0)  # the listener runs (and ends) before this step resumes
        return "answer"

    assert await unless_client_leaves(connection.receive, work()) == "answer"
    await asyncio.sleep(0.01)  # the queued callback runs here: this task goes on
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
