"""Stored answers sealed at rest: AES-256-GCM under a key derived from the server secret.

A stored answer is the tenant's conversation, prompts and outputs. Sealed, a database
dump, a backup or a replica read by someone without the server secret (which lives in
`HYDRANT_SECRET_KEY` or the data directory, never in the database) shows ids, models
and times, not what was said. The tenant and the answer's id are bound in as
associated data, so a sealed blob copied onto another row or tenant does not open.
The sealing itself is `platform/sealing.py`, shared with files and batch results.

Rotating the server secret leaves earlier answers unreadable: they read as absent (a
404) and expire as usual, which is why a rotation is logged and not an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hydrant.platform.sealing import Sealer, Unopenable

_LABEL = "hydrant-responses:seal"
_KIND = b"hydrant-response"


class UnreadableAnswer(Exception):
    """A sealed answer that does not open: another server secret, or a damaged row."""


class ResponseSealer:
    def __init__(self, server_secret: Callable[[], bytes]) -> None:
        self._sealer = Sealer(server_secret, label=_LABEL, kind=_KIND)

    def seal(self, tenant_id: str, response_id: str, payload: dict[str, Any]) -> bytes:
        plain = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        return self._sealer.seal(plain, tenant_id, response_id)

    def open(self, tenant_id: str, response_id: str, blob: bytes) -> dict[str, Any]:
        try:
            plain = self._sealer.open(blob, tenant_id, response_id)
        except Unopenable as exc:
            raise UnreadableAnswer(str(exc).replace("blob", "answer")) from None
        payload: dict[str, Any] = json.loads(plain)
        return payload
