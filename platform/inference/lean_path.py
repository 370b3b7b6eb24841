"""The generation routes answered straight from ASGI, past Litestar's per-request layers.

Why: a tenant waits for the gateway's own work before its first token, and behind an
upstream vLLM that work is most of what Hydrant adds to TTFT (#25: at most 2 ms above
a bare `vllm serve`). Measured per request, Litestar's layers between the route match
and the handler (the guard's call, the handler's parameters and dependencies) and
around its answer (the `Stream` or `Response` turned into ASGI messages, its task group)
were the largest part of that work that does nothing for the request. This path runs the
same checks and the same request path without them.

What stays the same: routing (this is route middleware: it runs after Litestar matched
the route), the app's middleware around it (header limits, the body's deadline, the
arrival-order gate), CORS and `before_send` (the `x-request-id` header), and every error
before the answer starts: it propagates to Litestar's exception handling, which renders
it exactly as a handler's (http/errors.py). The checks are the handlers' own functions:
the key under the brute-force guard, then `serving.answer_request`, as the handlers call it
(the body read under Litestar's size limit, decoded, run). The handlers stay, for the
OpenAPI schema and for what this path leaves to them (another method; a path Litestar
matched with a trailing slash).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from litestar import Request
from litestar.serialization import encode_json
from litestar.types import ASGIApp, Receive, Scope, Send

from hydrant.platform.auth.dependencies import authenticate_guarded
from hydrant.platform.auth.principal import INFERENCE_SCOPE
from hydrant.platform.errors import ClientDisconnected
from hydrant.platform.http.disconnect import unless_client_leaves
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.render import DONE
from hydrant.platform.inference.serving import Answer, Endpoint, answer_request

_JSON = (b"content-type", b"application/json")


def _header_list(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]


async def _send_whole(answer: Answer, send: Send) -> None:
    content = encode_json(answer.body)  # the encoder Litestar's `Response` uses
    headers = [_JSON, (b"content-length", b"%d" % len(content)), *_header_list(answer.headers)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": content, "more_body": False})


async def _write_stream(answer: Answer, send: Send) -> None:
    """The head, then each event as it comes; `[DONE]`, the last event, leaves with the
    body's end (one write, where the server would make two)."""
    assert answer.stream is not None
    await send(
        {"type": "http.response.start", "status": 200, "headers": _header_list(answer.headers)}
    )
    held: bytes | None = None  # `[DONE]`, sent once the stream has ended
    async for event in answer.stream:
        if held is not None:  # something after `[DONE]`: in order, as it came
            await send({"type": "http.response.body", "body": held, "more_body": True})
            held = None
        if event == DONE:
            held = event
            continue
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": held or b"", "more_body": False})


async def _send_stream(answer: Answer, receive: Receive, send: Send) -> None:
    """The events as they come; a client that leaves stops them (and the generation, which
    settles its one ledger entry for what was made however the stream ended)."""
    try:
        with contextlib.suppress(ClientDisconnected):  # nobody is left to answer
            await unless_client_leaves(receive, _write_stream(answer, send))
    finally:
        if answer.generation is not None:
            await answer.generation.aclose()


def lean_path(api: InferenceApi, endpoints: Mapping[str, Endpoint]) -> Callable[[ASGIApp], ASGIApp]:
    """ASGI middleware factory (`Litestar(middleware=[...])`, innermost) answering a POST to
    one of `endpoints`' paths itself; every other request goes on to its handler."""

    def wrap(app: ASGIApp) -> ASGIApp:
        async def lean(scope: Scope, receive: Receive, send: Send) -> None:
            endpoint = endpoints.get(scope["path"]) if scope.get("method") == "POST" else None
            if endpoint is None:  # a websocket's scope has no method
                await app(scope, receive, send)
                return
            request: Request[Any, Any, Any] = Request(scope, receive)
            principal = await authenticate_guarded(
                request, request.headers.get("authorization"), INFERENCE_SCOPE
            )
            answer = await answer_request(request, api, principal, endpoint)
            if answer.stream is None:
                await _send_whole(answer, send)
            else:
                await _send_stream(answer, receive, send)

        return lean

    return wrap
