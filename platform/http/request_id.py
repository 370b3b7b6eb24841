"""Every response carries `x-request-id`; the same id keys the ledger entry and the logs.

The id is made on first use and kept in the ASGI scope, so the handler, the
ledger and the response header agree; the header is added in a `before_send`
hook, which also sees the router's own 404/405 answers and streamed bodies.
"""

from __future__ import annotations

import secrets

from litestar.datastructures import MutableScopeHeaders
from litestar.types import Message, Scope


def new_request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


def request_id_for(scope: Scope) -> str:
    state = scope.setdefault("state", {})
    request_id = state.get("request_id")
    if request_id is None:
        request_id = state["request_id"] = new_request_id()
    return str(request_id)


async def add_request_id_header(message: Message, scope: Scope) -> None:
    if message["type"] == "http.response.start":
        MutableScopeHeaders.from_message(message)["x-request-id"] = request_id_for(scope)
