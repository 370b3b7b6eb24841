"""The signed session cookie of the web pages, and the flags it is sent with.

Why a signed cookie and not a server-side store: gateways are stateless and
several may serve one site; any node holding the server secret can check a
cookie. The cookie carries no secret: only the key's public prefix and id,
the scope it signed in with, a random session id and its expiry. Every page
view looks the key up again (`viewer.py`), so revoking the key, expiring it
or suspending its tenant ends its web sessions at once; the signature stops
anyone from minting a cookie for a key they never held.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from hydrant.b64url import b64url_decode, b64url_encode
from hydrant.platform import server_secret as secret

SESSION_COOKIE = "hydrant_session"
CSRF_COOKIE = "hydrant_csrf"
SESSION_LIFETIME_S = 12 * 3600
_VERSION = "v1"


def derive_key(server_secret: bytes, purpose: str) -> bytes:
    """A key of its own per use, so a session signature can never double as an API key HMAC."""
    return secret.derive_key(server_secret, f"hydrant-web:{purpose}")


@dataclass(frozen=True)
class SessionData:
    sid: str  # random: binds the CSRF token to this sign-in
    key_id: str
    prefix: str
    scope: str  # "admin" or "inference": the scope the key signed in with
    expires: int  # unix seconds

    @classmethod
    def new(cls, *, key_id: str, prefix: str, scope: str, now: float | None = None) -> SessionData:
        issued = int(time.time() if now is None else now)
        return cls(
            sid=secrets.token_urlsafe(16),
            key_id=key_id,
            prefix=prefix,
            scope=scope,
            expires=issued + SESSION_LIFETIME_S,
        )


def encode_session(data: SessionData, key: bytes) -> str:
    payload = b64url_encode(json.dumps(asdict(data), separators=(",", ":")).encode())
    body = f"{_VERSION}.{payload}"
    signature = b64url_encode(hmac.new(key, body.encode(), hashlib.sha256).digest())
    return f"{body}.{signature}"


def decode_session(cookie: str | None, key: bytes, now: float | None = None) -> SessionData | None:
    """The session a cookie holds; None for a missing, forged, malformed or expired one."""
    if not cookie or len(cookie) > 2048:
        return None
    parts = cookie.split(".")
    if len(parts) != 3 or parts[0] != _VERSION:
        return None
    body = f"{parts[0]}.{parts[1]}"
    expected = b64url_encode(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, parts[2]):
        return None
    try:
        raw: Any = json.loads(b64url_decode(parts[1]))
        data = SessionData(
            sid=str(raw["sid"]),
            key_id=str(raw["key_id"]),
            prefix=str(raw["prefix"]),
            scope=str(raw["scope"]),
            expires=int(raw["expires"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if data.expires <= (time.time() if now is None else now):
        return None
    return data


def is_secure_request(scheme: str, forwarded_proto: str | None) -> bool:
    """Behind TLS: served over https, or a proxy that terminated TLS says so."""
    if scheme == "https":
        return True
    first = (forwarded_proto or "").split(",")[0].strip().lower()
    return first == "https"
