"""Generation requests enter the admission path in arrival order, a few at a time
(quotas/ingest_order.py says why).

A request takes its place once its whole body is read (a slow body never holds one: it
is read first, under the hardening deadline) and gives it up when the quota gate has
admitted it, or when the response starts (an error), or when the app returns, or at the
end of its lease (`ingest_order.LEASE_S`), whichever comes first. Only the generation
routes are ordered; health, admin and file uploads never wait here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

from hydrant.platform.quotas.ingest_order import IngestGate, drop_place, hold_place

GENERATION_PATHS = frozenset(
    {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/embeddings"}
)


async def _read_body(receive: Receive, max_bytes: int) -> tuple[list[ReceiveMessage], bool]:
    """The request body's messages, and whether that is all of it: False when the client
    left before its end, or when it grew past `max_bytes` (the app refuses it: 413)."""
    messages: list[ReceiveMessage] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, False
        if not message.get("more_body", False):
            return messages, True
        size += len(message.get("body", b""))
        if size > max_bytes:
            return messages, False


def ingest_middleware(gate: IngestGate, max_body_bytes: int) -> Callable[[ASGIApp], ASGIApp]:
    """ASGI middleware factory (`Litestar(middleware=[...])`) ordering generation requests
    through `gate`; every other request passes untouched. A body over `max_body_bytes`
    is not held here: it goes on unordered, to the app's own size limit."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
            if (
                scope["type"] != "http"
                or scope.get("method") != "POST"
                or scope.get("path") not in GENERATION_PATHS
            ):
                await app(scope, receive, send)
                return
            body, whole = await _read_body(receive, max_body_bytes)
            if not whole:  # gone mid-body, or too large: the app sees what came, then the rest
                await app(scope, _replay(body, receive), send)
                return
            place = await gate.acquire()
            token = hold_place(place)

            async def send_releasing(message: Message) -> None:
                if message["type"] == "http.response.start":
                    place.release()  # an error, or the answer's first byte: nothing to order
                await send(message)

            try:
                await app(scope, _replay(body, receive), send_releasing)
            finally:
                place.release()
                drop_place(token)

        return middleware

    return wrap


def _replay(messages: list[ReceiveMessage], receive: Receive) -> Receive:
    """`receive` that gives `messages` first, then the server's own (a disconnect)."""
    pending = deque(messages)

    async def replay() -> ReceiveMessage:
        if pending:
            return pending.popleft()
        return await receive()

    return replay
