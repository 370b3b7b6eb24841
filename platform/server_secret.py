"""The server secret under which stored API keys are HMAC'd.

`HYDRANT_SECRET_KEY` when set; otherwise a random secret generated once and
kept in `<data_dir>/secret.key` (mode 0600), so the embedded default works
with no configuration and keys survive restarts. Why a file and not the
database: a secret stored beside the hashes would let a database dump confirm
leaked keys, which is what the HMAC pepper exists to prevent. Several gateway
nodes must share one secret: without `HYDRANT_SECRET_KEY` each node would make
its own, so that case is logged loudly.

Below every domain that uses it (auth's key hashes, web cookies, sealed
stored answers, digest links, jobs), so none of them imports another for it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from hydrant.errors import ConfigurationError
from hydrant.settings import Settings

log = logging.getLogger(__name__)

MIN_SERVER_SECRET_BYTES = 16
SECRET_FILE_NAME = "secret.key"  # noqa: S105 - a file name, not a secret


def derive_key(server_secret: bytes, label: str) -> bytes:
    """A 32-byte key of its own per use of the server secret (HMAC-SHA256 of the label),
    so a cookie signature, a sealed stored answer and a key hash never share a key."""
    return hmac.new(server_secret, label.encode(), hashlib.sha256).digest()


def secret_file(settings: Settings) -> Path:
    return settings.data_dir / SECRET_FILE_NAME


def load_server_secret(settings: Settings) -> bytes:
    """The configured secret, or the data directory's (created on first use)."""
    if settings.secret_key is not None:
        secret = settings.secret_key.encode("utf-8")
        if len(secret) < MIN_SERVER_SECRET_BYTES:
            raise ConfigurationError(
                f"HYDRANT_SECRET_KEY must be at least {MIN_SERVER_SECRET_BYTES} bytes long"
            )
        return secret
    if not settings.embedded:
        log.warning(
            "HYDRANT_SECRET_KEY is not set: using %s; every gateway node must share one"
            " secret or keys made on one node fail on the others",
            secret_file(settings),
        )
    return _read_or_create(secret_file(settings))


def _read_or_create(path: Path) -> bytes:
    if not path.exists():
        _create(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s is readable by other users (mode %o); chmod 600 it", path, mode)
    secret = path.read_bytes().strip()
    if len(secret) < MIN_SERVER_SECRET_BYTES:
        raise ConfigurationError(f"{path} holds no usable secret (too short); remove it")
    return secret


def _create(path: Path) -> None:
    """Write a fresh secret atomically: two processes starting at once agree on one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_urlsafe(48).encode("ascii") + b"\n")
        try:
            os.link(temporary, path)  # fails if another process won the race: keep theirs
            log.info("generated the server secret", extra={"path": str(path)})
        except FileExistsError:
            pass
    finally:
        temporary.unlink(missing_ok=True)
