"""The OpenAPI schema tells the truth about errors: every one is an OpenAI error object.

Why patch the handlers: Litestar documents a handler's 400 with its own
validation-error shape (`status_code`, `detail`, `extra`), but the exception
table (`http.errors`) answers every error, on `/v1` and `/admin` alike, with
`{"error": {"message", "type", "param", "code"}}`. A client generated from
the schema, or a fuzzer checking responses against it, would otherwise be
told a lie. Statuses a handler declares itself keep its own description.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from litestar import Litestar
from litestar.handlers import HTTPRouteHandler
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import OpenAPIMediaType, Operation, RequestBody, Schema
from litestar.openapi.spec.enums import OpenAPIType
from litestar.routes import HTTPRoute
from msgspec import Struct


class ErrorObject(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(Struct):
    """OpenAI's error shape, which the official clients turn into the right exception."""

    error: ErrorObject


ERROR_STATUSES = {
    400: "Malformed request or invalid parameter",
    401: "Missing or invalid API key",
    403: "The key may not do this (wrong scope, suspended tenant)",
    404: "No such object (or not visible to this key)",
    405: "Method not allowed on this path",
    408: "The request body did not arrive in time",
    409: "Conflicts with the current state",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Valid JSON that cannot be served (e.g. prompt too long)",
    429: "Rate limit, quota or budget refusal; see Retry-After",
    431: "Request headers too large",
    500: "Internal error (with the request id)",
    503: "A dependency is temporarily unavailable; see Retry-After",
}


def openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(title="Hydrant", version="1", create_examples=False)


def declare_error_responses(app: Litestar) -> None:
    """Document the OpenAI error body for every status on every operation of `app`."""
    for route in app.routes:
        if not isinstance(route, HTTPRoute):
            continue
        for handler in route.route_handlers:
            if isinstance(handler, HTTPRouteHandler):
                _declare(handler)


def _declare(handler: HTTPRouteHandler) -> None:
    declared = dict(handler.responses or {})
    for status, description in ERROR_STATUSES.items():
        if status != handler.status_code:
            declared.setdefault(
                status, ResponseSpec(data_container=ErrorBody, description=description)
            )
    handler.responses = declared


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `#/$defs/…` reference replaced by the definition (no cycles here)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def raw_json_body_operation(
    body: type[Struct], *, streams: bool, refine: Callable[[dict[str, Any]], None] | None = None
) -> type[Operation]:
    """An `operation_class` for a handler that decodes its JSON body itself.

    Why: the `/v1` handlers read the raw body so that bad input gets OpenAI's
    error (with `param`), so Litestar cannot see the body type; this documents
    it (from the same msgspec struct that decodes it), and, for handlers that
    stream, the `text/event-stream` answer of `"stream": true` beside the JSON one.
    `refine` adds the rules the handler checks itself (allowed values, non-empty lists).
    """
    raw = msgspec.json.schema(body)
    inlined = _inline(raw, raw.get("$defs", {}))
    if refine is not None:
        refine(inlined)
    request_schema = cast(Schema, inlined)

    @dataclass
    class RawJsonBodyOperation(Operation):
        def __post_init__(self) -> None:
            media = OpenAPIMediaType(schema=request_schema)
            self.request_body = RequestBody(content={"application/json": media}, required=True)
            ok = (self.responses or {}).get("200")
            if streams and ok is not None and not isinstance(ok, dict) and hasattr(ok, "content"):
                content = dict(ok.content or {})
                # OpenAPI 3.1: the schema of an event stream describes one event.
                event = Schema(
                    type=OpenAPIType.OBJECT,
                    properties={
                        "data": Schema(
                            type=OpenAPIType.STRING,
                            description="one JSON chunk, or `[DONE]` at the end",
                        )
                    },
                    required=["data"],
                )
                content["text/event-stream"] = OpenAPIMediaType(schema=event)
                ok.content = content

    RawJsonBodyOperation.__name__ = f"{body.__name__}Operation"
    return RawJsonBodyOperation
