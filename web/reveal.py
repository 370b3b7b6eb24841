"""A new key's secret, carried sealed to its one showing and then forgotten.

Why not render the secret in the POST's response: reloading that page would
post again and make another key. So the POST redirects to the reveal page,
and the secret travels to it in a cookie of its own: encrypted and
authenticated (AES-256-GCM under a key derived from the server secret),
bound to the session that made it, valid for `TTL_S`, sent only to that
reveal page (`Path`), never readable by scripts (`HttpOnly`). The page deletes
the cookie as it shows the secret, so a reload says "already shown".

Why a cookie and not a store on the server: gateways are stateless and
several serve one site (the Kubernetes manifests run more than one), so the
redirect may reach another gateway than the POST did; every gateway holding
the server secret can open the cookie, and no server ever keeps the secret.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from hydrant.b64url import b64url_decode, b64url_encode

TTL_S = 600
REVEAL_PATH = "/ui/keys/shown"
COOKIE_PREFIX = "hydrant_reveal_"
_VERSION = b"v1"
_NONCE_BYTES = 12
_MAX_COOKIE_CHARS = 2048


@dataclass(frozen=True)
class Reveal:
    secret: str
    key_id: str
    key_prefix: str
    tenant_id: str | None
    action: str  # "created" or "rotated"


def cookie_name(token: str) -> str:
    """One cookie per reveal, so two keys made in two tabs are each shown."""
    return COOKIE_PREFIX + token


def _aad(sid: str, token: str) -> bytes:
    return b"hydrant-web-reveal|" + _VERSION + b"|" + sid.encode() + b"|" + token.encode()


def seal(reveal: Reveal, *, key: bytes, sid: str, now: float | None = None) -> tuple[str, str]:
    """(token, cookie value): the token names the reveal page, the value carries the secret."""
    token = secrets.token_urlsafe(12)
    expires = int(time.time() if now is None else now) + TTL_S
    plain = json.dumps({**asdict(reveal), "expires": expires}, separators=(",", ":")).encode()
    nonce = os.urandom(_NONCE_BYTES)
    sealed = nonce + AESGCM(key).encrypt(nonce, plain, _aad(sid, token))
    return token, b64url_encode(sealed)


def unseal(
    value: str | None, *, key: bytes, sid: str, token: str, now: float | None = None
) -> Reveal | None:
    """The reveal in a cookie value; None for a missing, forged, foreign or expired one."""
    if not value or len(value) > _MAX_COOKIE_CHARS or not sid:
        return None
    try:
        sealed = b64url_decode(value)
        nonce, body = sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:]
        raw = json.loads(AESGCM(key).decrypt(nonce, body, _aad(sid, token)))
        reveal = Reveal(
            secret=str(raw["secret"]),
            key_id=str(raw["key_id"]),
            key_prefix=str(raw["key_prefix"]),
            tenant_id=None if raw["tenant_id"] is None else str(raw["tenant_id"]),
            action=str(raw["action"]),
        )
        expires = int(raw["expires"])
    except (InvalidTag, ValueError, KeyError, TypeError):
        return None
    if expires <= (time.time() if now is None else now):
        return None
    return reveal
