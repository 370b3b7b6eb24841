"""The ingest middleware: generation requests enter the admission path in arrival order
with at most `limit` in it; a request holds its place only from its whole body to its
admission (or its response, or its end), and nothing else waits for a place.

Plain ASGI calls, an app that takes a few awaits before it admits (as the real path does:
auth, the quota reservation, the dispatch); the real gateway runs it in the e2e tests.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hydrant.platform.http.ingest import ingest_middleware
from hydrant.platform.quotas.ingest_order import IngestGate, leave_ingest_gate

Message = dict[str, Any]


def _scope(path: str = "/v1/completions", method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "headers": []}


class Client:
    """One connection: its body messages, then (when told) a disconnect."""

    def __init__(self, *chunks: bytes, hold: bool = False) -> None:
        self.queue: asyncio.Queue[Message] = asyncio.Queue()
        for i, chunk in enumerate(chunks):
            more = hold or i < len(chunks) - 1
            self.queue.put_nowait({"type": "http.request", "body": chunk, "more_body": more})
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        return await self.queue.get()

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def finish_body(self, chunk: bytes = b"") -> None:
        self.queue.put_nowait({"type": "http.request", "body": chunk, "more_body": False})


async def _settle(rounds: int = 20) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def _staged_app(events: list[tuple[str, int]], stages: int = 3) -> Any:
    """Reads its body, takes `stages` awaits, is admitted, answers."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        n = int(body)
        events.append(("enter", n))
        for _ in range(stages):
            await asyncio.sleep(0)
        events.append(("admitted", n))
        leave_ingest_gate()
        await asyncio.sleep(0.001)  # the generation, after admission
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def test_a_burst_is_admitted_in_arrival_order_with_the_first_ones_early() -> None:
    events: list[tuple[str, int]] = []
    gate = IngestGate(2)
    app = ingest_middleware(gate, 1 << 20)(_staged_app(events))
    clients = [Client(str(n).encode()) for n in range(20)]
    await asyncio.gather(*(app(_scope(), c.receive, c.send) for c in clients))
    admitted = [n for kind, n in events if kind == "admitted"]
    assert admitted == list(range(20))
    # the first was admitted before the last ones even entered the path
    assert events.index(("admitted", 0)) < events.index(("enter", 10))
    assert all(c.sent[-1]["body"] == b"ok" for c in clients)
    assert gate.in_use == 0 and gate.waiting == 0


async def test_without_the_gate_the_same_burst_moves_in_lockstep() -> None:
    """Why the gate exists: the same app, ungated, admits its first request only after
    every request has entered."""
    events: list[tuple[str, int]] = []
    app = _staged_app(events)
    clients = [Client(str(n).encode()) for n in range(20)]
    await asyncio.gather(*(app(_scope(), c.receive, c.send) for c in clients))
    assert events.index(("admitted", 0)) > events.index(("enter", 19))


async def test_other_routes_never_wait_for_a_place() -> None:
    gate = IngestGate(1)
    held = await gate.acquire()
    seen: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(f"{scope['method']} {scope['path']}")

    wrapped = ingest_middleware(gate, 1 << 20)(app)
    for scope in (_scope("/health", "GET"), _scope("/v1/files"), _scope("/v1/models", "GET")):
        client = Client(b"")
        await asyncio.wait_for(wrapped(scope, client.receive, client.send), 1)
    assert seen == ["GET /health", "POST /v1/files", "GET /v1/models"]
    held.release()


async def test_a_slow_body_holds_no_place() -> None:
    events: list[tuple[str, int]] = []
    gate = IngestGate(1)
    app = ingest_middleware(gate, 1 << 20)(_staged_app(events))
    slow = Client(b"1", hold=True)  # the body's end has not come
    quick = Client(b"2")
    slow_task = asyncio.create_task(app(_scope(), slow.receive, slow.send))
    await _settle()
    await asyncio.wait_for(app(_scope(), quick.receive, quick.send), 1)
    assert events[:2] == [("enter", 2), ("admitted", 2)]
    assert gate.in_use == 0
    slow.finish_body()
    await asyncio.wait_for(slow_task, 1)
    assert ("admitted", 1) in events


async def test_the_place_is_freed_when_the_response_starts() -> None:
    """An error answered before admission (a 429 from the quota gate, say) frees the place
    with its first byte, and a request that never admits frees it when it ends."""
    gate = IngestGate(1)
    release = asyncio.Event()

    async def refusing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 429, "headers": []})
        await release.wait()
        await send({"type": "http.response.body", "body": b"{}"})

    wrapped = ingest_middleware(gate, 1 << 20)(refusing)
    client = Client(b"{}")
    task = asyncio.create_task(wrapped(_scope(), client.receive, client.send))
    await _settle()
    assert gate.in_use == 0
    release.set()
    await task

    async def failing(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        raise RuntimeError("boom")

    wrapped = ingest_middleware(gate, 1 << 20)(failing)
    with pytest.raises(RuntimeError, match="boom"):
        await wrapped(_scope(), Client(b"{}").receive, Client().send)
    assert gate.in_use == 0


async def test_the_app_reads_the_same_body_and_then_the_disconnect() -> None:
    gate = IngestGate(1)
    received: list[Message] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            received.append(message)
            if message["type"] == "http.disconnect":
                return

    wrapped = ingest_middleware(gate, 1 << 20)(app)
    client = Client(b'{"a":', b" 1}")
    client.queue.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(wrapped(_scope(), client.receive, client.send), 1)
    assert [m.get("body") for m in received] == [b'{"a":', b" 1}", None]
    assert received[-1]["type"] == "http.disconnect"


async def test_a_body_over_the_limit_goes_on_unheld_and_whole() -> None:
    """Not buffered past the limit: the app gets every byte (and refuses the size itself)."""
    gate = IngestGate(1)
    held = await gate.acquire()  # were it held, the request would wait for ever
    chunks: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            chunks.append(message["body"])
            if not message["more_body"]:
                return

    wrapped = ingest_middleware(gate, 10)(app)
    client = Client(b"x" * 8, b"y" * 8, b"z" * 8, b"end")
    await asyncio.wait_for(wrapped(_scope(), client.receive, client.send), 1)
    assert b"".join(chunks) == b"x" * 8 + b"y" * 8 + b"z" * 8 + b"end"
    held.release()
