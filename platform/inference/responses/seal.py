"""Stored answers sealed at rest: AES-256-GCM under a key derived from the server secret.

A stored answer is the tenant's conversation, prompts and outputs. Sealed, a database
dump, a backup or a replica read by someone without the server secret (which lives in
`HYDRANT_SECRET_KEY` or the data directory, never in the database) shows ids, models
and times, not what was said. The tenant and the answer's id are bound in as
associated data, so a sealed blob copied onto another row or tenant does not open.

Rotating the server secret leaves earlier answers unreadable: they read as absent (a
404) and expire as usual, which is why a rotation is logged and not an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hydrant.platform.server_secret import derive_key

_VERSION = b"v1"
_NONCE_BYTES = 12
_LABEL = "hydrant-responses:seal"


class UnreadableAnswer(Exception):
    """A sealed answer that does not open: another server secret, or a damaged row."""


class ResponseSealer:
    def __init__(self, server_secret: Callable[[], bytes]) -> None:
        self._secret_source = server_secret
        self._aead: AESGCM | None = None

    def _cipher(self) -> AESGCM:
        """Resolved on first use, so building an app never touches the data directory."""
        if self._aead is None:
            self._aead = AESGCM(derive_key(self._secret_source(), _LABEL))
        return self._aead

    @staticmethod
    def _aad(tenant_id: str, response_id: str) -> bytes:
        return b"|".join((b"hydrant-response", _VERSION, tenant_id.encode(), response_id.encode()))

    def seal(self, tenant_id: str, response_id: str, payload: dict[str, Any]) -> bytes:
        plain = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._cipher().encrypt(nonce, plain, self._aad(tenant_id, response_id))
        return _VERSION + nonce + sealed

    def open(self, tenant_id: str, response_id: str, blob: bytes) -> dict[str, Any]:
        version, rest = bytes(blob[: len(_VERSION)]), bytes(blob[len(_VERSION) :])
        if version != _VERSION:
            raise UnreadableAnswer(f"unknown seal version {version!r}")
        nonce, body = rest[:_NONCE_BYTES], rest[_NONCE_BYTES:]
        try:
            plain = self._cipher().decrypt(nonce, body, self._aad(tenant_id, response_id))
        except InvalidTag:
            raise UnreadableAnswer("the answer does not open under this server secret") from None
        payload: dict[str, Any] = json.loads(plain)
        return payload
