"""Storing and checking API keys: HMAC-SHA256 under a server secret, compared in constant time.

Why HMAC and not bcrypt/argon2: a key carries ~190 random bits, so slow
hashing buys nothing against guessing and would cost milliseconds on every
request. The server secret (a pepper kept out of the database) means a
database dump alone cannot even confirm a leaked key. `verify_against_dummy`
exists so an unknown prefix costs the same work as a known one and the
response time does not reveal which prefixes exist.
"""

from __future__ import annotations

import hmac

from hydrant.platform.server_secret import MIN_SERVER_SECRET_BYTES

HASH_HEX_LENGTH = 64
# Same length as a real digest, so compare_digest takes the same path; matches nothing.
_DUMMY_HASH = "0" * HASH_HEX_LENGTH


def _check_server_secret(server_secret: bytes) -> None:
    if not isinstance(server_secret, bytes | bytearray):
        raise TypeError("server_secret must be bytes (encode the configured secret first)")
    if len(server_secret) < MIN_SERVER_SECRET_BYTES:
        raise ValueError(f"server_secret must be at least {MIN_SERVER_SECRET_BYTES} bytes long")


def hash_key(secret: str, server_secret: bytes) -> str:
    """The value stored for a key: hex HMAC-SHA256 of the whole key text."""
    _check_server_secret(server_secret)
    return hmac.digest(server_secret, secret.encode("utf-8"), "sha256").hex()  # one C call


def verify_key(secret: str, stored_hash: str, server_secret: bytes) -> bool:
    """True when `secret` is the key whose HMAC is `stored_hash`; constant time in the digest."""
    candidate = hash_key(secret, server_secret)
    return hmac.compare_digest(candidate.encode("ascii"), stored_hash.encode("utf-8"))


def verify_against_dummy(secret: str, server_secret: bytes) -> bool:
    """Do the work of `verify_key` for a prefix with no stored key; always False."""
    verify_key(secret, _DUMMY_HASH, server_secret)
    return False
