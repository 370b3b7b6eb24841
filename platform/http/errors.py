"""The one table that turns exceptions into HTTP responses, in OpenAI's error shape.

`{"error": {"message", "type", "param", "code"}}` on every path (`/v1`
and `/admin` alike), so the official `openai` client raises the right
exception class and nothing ever answers a bare 500 page.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from litestar import Request, Response
from litestar.exceptions import (
    HTTPException,
    MethodNotAllowedException,
    NotFoundException,
    ValidationException,
)
from litestar.types import ExceptionHandlersMap

from hydrant.platform.errors import DomainError
from hydrant.platform.http.request_id import request_id_for

log = logging.getLogger(__name__)

_STATUS_TYPES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "payload_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    422: ("invalid_request_error", "unprocessable"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    431: ("invalid_request_error", "request_header_fields_too_large"),
}


def error_body(
    message: str, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _response(
    status: int,
    body: dict[str, Any],
    retry_after: float | None = None,
    extra: dict[str, str] | None = None,
) -> Response[dict[str, Any]]:
    headers = dict(extra or {})
    if retry_after is not None:
        headers["retry-after"] = str(max(1, math.ceil(retry_after)))
    return Response(body, status_code=status, headers=headers)


def handle_domain_error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    if not isinstance(exc, DomainError):  # pragma: no cover - registered for DomainError only
        return handle_unexpected(_, exc)
    body = error_body(exc.message, exc.type, exc.code, exc.param)
    return _response(exc.status, body, exc.retry_after, exc.headers)


def handle_validation_error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """Litestar's own parsing errors (malformed JSON, wrong types) in the OpenAI shape."""
    detail = getattr(exc, "detail", "") or "invalid request"
    extra = getattr(exc, "extra", None)
    param = None
    if isinstance(extra, list) and extra and isinstance(extra[0], dict):
        key = extra[0].get("key")
        param = str(key) if key else None
        message = extra[0].get("message")
        if message:
            detail = f"{detail}: {message}"
    return _response(
        400, error_body(str(detail), "invalid_request_error", "invalid_request", param)
    )


def handle_http_error(_: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    status = getattr(exc, "status_code", 500)
    type_, code = _STATUS_TYPES.get(status, ("server_error", "server_error"))
    detail = getattr(exc, "detail", "") or type_
    if status == 404:
        detail = "no such route"
    return _response(status, error_body(str(detail), type_, code))


def handle_unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[dict[str, Any]]:
    """A bug: log it with the request id (never the body) and answer a generic 500."""
    request_id = request_id_for(request.scope)
    log.error(
        "unhandled error", exc_info=exc, extra={"request_id": request_id, "path": request.url.path}
    )
    body = error_body(f"internal error (request id {request_id})", "server_error", "internal_error")
    return _response(500, body)


EXCEPTION_HANDLERS: ExceptionHandlersMap = {
    DomainError: handle_domain_error,
    ValidationException: handle_validation_error,
    NotFoundException: handle_http_error,
    MethodNotAllowedException: handle_http_error,
    HTTPException: handle_http_error,
    Exception: handle_unexpected,
}
