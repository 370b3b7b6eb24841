"""Tenant data sealed at rest: AES-256-GCM under a key derived from the server secret.

What a tenant sends or is answered (stored Responses answers, uploaded files, batch
results) is sealed before it is written, so a database dump, a backup, a replica or a
volume read by someone without the server secret (`HYDRANT_SECRET_KEY` or the data
directory, never the database) shows ids, sizes and times, not content. Each use has
its own key (`derive_key` of its label) and binds its owner and id into the seal as
associated data, so a blob copied onto another row or tenant does not open.

Why one class: every store seals the same way (version, nonce, ciphertext), and a
second copy of this code would be a second place to get the nonce or the binding wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hydrant.platform.server_secret import derive_key

VERSION = b"v1"
NONCE_BYTES = 12


class Unopenable(Exception):
    """A sealed blob that does not open: another server secret, another owner, or damage."""


class Sealer:
    """Seals and opens blobs of one kind (`kind` and `label` name it) for an owner and id."""

    def __init__(self, server_secret: Callable[[], bytes], *, label: str, kind: bytes) -> None:
        self._secret_source = server_secret
        self._label = label
        self._kind = kind
        self._aead: AESGCM | None = None

    def _cipher(self) -> AESGCM:
        """Resolved on first use, so building an app never touches the data directory."""
        if self._aead is None:
            self._aead = AESGCM(derive_key(self._secret_source(), self._label))
        return self._aead

    def _aad(self, context: tuple[str, ...]) -> bytes:
        return b"|".join((self._kind, VERSION, *(part.encode() for part in context)))

    def seal(self, plain: bytes, *context: str) -> bytes:
        """`plain` sealed for `context` (e.g. tenant id, object id): version, nonce, ciphertext."""
        nonce = os.urandom(NONCE_BYTES)
        return VERSION + nonce + self._cipher().encrypt(nonce, plain, self._aad(context))

    def open(self, blob: bytes, *context: str) -> bytes:
        version, rest = bytes(blob[: len(VERSION)]), bytes(blob[len(VERSION) :])
        if version != VERSION:
            raise Unopenable(f"unknown seal version {version!r}")
        nonce, body = rest[:NONCE_BYTES], rest[NONCE_BYTES:]
        try:
            return self._cipher().decrypt(nonce, body, self._aad(context))
        except InvalidTag:
            raise Unopenable("the blob does not open under this server secret") from None
