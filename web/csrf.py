"""CSRF protection of every form under `/ui`: a signed double-submit token.

Each browser gets a random `hydrant_csrf` cookie (HttpOnly); a form carries
`HMAC(key, cookie | session id)`. A cross-site page can make the browser send
the cookie but can neither read it nor compute the HMAC, so its forged post
carries no valid token and is refused with 403. Binding to the session id
means a token from before sign-in (or another session) is useless after it.
Only `/ui` is cookie-authenticated, so only `/ui` needs this: the bearer-key
APIs (`/v1`, `/admin`) are not reachable by a cross-site form with the
victim's credentials.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

FIELD = "csrf_token"
HEADER = "x-csrf-token"


def new_cookie_value() -> str:
    return secrets.token_urlsafe(32)


def token_for(key: bytes, cookie_value: str, sid: str) -> str:
    message = f"{cookie_value}|{sid}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def token_valid(key: bytes, cookie_value: str | None, sid: str, submitted: str | None) -> bool:
    if not cookie_value or not submitted:
        return False
    return hmac.compare_digest(token_for(key, cookie_value, sid), submitted)
