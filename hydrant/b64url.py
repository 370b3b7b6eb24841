"""Unpadded URL-safe base64, the text form of every token Hydrant puts in a cookie or a link.

Why unpadded: `=` must be escaped in URLs and cookie values, and the length
tells the padding back anyway.
"""

from __future__ import annotations

import base64


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """The bytes of `text`; `binascii.Error` (a ValueError) when it is not base64."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
