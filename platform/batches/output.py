"""A batch's output and error files: OpenAI's line shape, one line per `custom_id`.

Each finished line is stored as the line it will be in its file (sealed: it holds the
tenant's answer, and its custom_id), so finishing a batch only concatenates them:

    {"id": "batch_req_…", "custom_id": "…",
     "response": {"status_code": 200, "request_id": "batch_req_…", "body": {…}},
     "error": null}

A request the endpoint refused is a line of the error file with its status code and
OpenAI's error body; a line never run (the batch was cancelled or expired first) is a
line of the error file with `response` null and `error` saying why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec

from hydrant.platform.http.errors import error_body
from hydrant.platform.sealing import Sealer

_LABEL = "hydrant-batches:seal"
_KIND = b"hydrant-batch-line"
NOT_RUN = {
    "cancelled": ("batch_cancelled", "This request was not run: the batch was cancelled."),
    "expired": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "failed": ("batch_failed", "This request was not run: the batch failed."),
}


def line_request_id(batch_id: str, line: int) -> str:
    """A line's request id: the key of its one ledger entry and the id of its output line."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{line}"


def answered(custom_id: str, request_id: str, status: int, body: Any) -> bytes:
    """The line of an answered request (2xx: the output file; else the error file)."""
    return msgspec.json.encode(
        {
            "id": request_id,
            "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": body},
            "error": None,
        }
    )


def refused(
    custom_id: str,
    request_id: str,
    status: int,
    message: str,
    kind: str,
    code: str | None,
    param: str | None,
) -> bytes:
    return answered(custom_id, request_id, status, error_body(message, kind, code, param))


def not_run(custom_id: str, request_id: str, why: str) -> bytes:
    code, message = NOT_RUN[why]
    return json.dumps(
        {
            "id": request_id,
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        },
        separators=(",", ":"),
    ).encode()


class LineSealer:
    """Seals a line's stored result, bound to its tenant, batch and line number."""

    def __init__(self, server_secret: Callable[[], bytes]) -> None:
        self._sealer = Sealer(server_secret, label=_LABEL, kind=_KIND)

    def seal(self, tenant_id: str, batch_id: str, line: int, result: bytes) -> bytes:
        return self._sealer.seal(result, tenant_id, batch_id, str(line))

    def open(self, tenant_id: str, batch_id: str, line: int, sealed: bytes) -> bytes:
        return self._sealer.open(sealed, tenant_id, batch_id, str(line))
