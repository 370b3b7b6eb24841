"""Signed unsubscribe tokens: the link in every digest stops mail to that one recipient.

Why signed and not a random id stored per mail: a token that carries its own
scope and address needs no table of issued links, and the HMAC under the
server secret means nobody can unsubscribe someone else by editing the link.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from hydrant.b64url import b64url_decode, b64url_encode
from hydrant.platform.errors import InvalidRequest

_CONTEXT = b"hydrant-digest-unsubscribe:"  # keeps these MACs apart from the key hashes


@dataclass(frozen=True)
class Unsubscription:
    scope: str  # a tenant id, or ADMIN_SCOPE for the admin digest
    email: str


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, _CONTEXT + payload, hashlib.sha256).digest()


def make_token(secret: bytes, scope: str, email: str) -> str:
    payload = json.dumps({"s": scope, "e": email}, separators=(",", ":")).encode("utf-8")
    return f"{b64url_encode(payload)}.{b64url_encode(_mac(secret, payload))}"


def read_token(secret: bytes, token: str) -> Unsubscription:
    """The scope and address a token was made for; 400 when it is malformed or forged."""
    bad = InvalidRequest("this unsubscribe link is not valid", param="token")
    head, dot, tail = token.partition(".")
    if not dot or len(token) > 2000:
        raise bad
    try:
        payload, mac = b64url_decode(head), b64url_decode(tail)
    except (ValueError, TypeError):
        raise bad from None
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise bad
    try:
        data = json.loads(payload)
        return Unsubscription(scope=str(data["s"]), email=str(data["e"]))
    except (ValueError, KeyError, TypeError):
        raise bad from None
