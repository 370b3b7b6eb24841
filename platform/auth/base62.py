"""Base62: the alphabet of API keys.

Why base62 and not base64 or hex: every character is a "word" character, so a
key selects as one word on double-click and survives URLs, shells and YAML
unquoted; and it is denser than hex (5.95 bits per character).
"""

from __future__ import annotations

import secrets

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
BASE = len(ALPHABET)


def encode_fixed(value: int, width: int) -> str:
    """Encode a non-negative integer in exactly `width` characters, zero-padded on the left."""
    if value < 0:
        raise ValueError("base62 encodes non-negative integers only")
    digits: list[str] = []
    while value:
        value, digit = divmod(value, BASE)
        digits.append(ALPHABET[digit])
    if len(digits) > width:
        raise ValueError(f"value does not fit in {width} base62 characters")
    return "".join(reversed(digits)).rjust(width, ALPHABET[0])


def random_string(length: int) -> str:
    """`length` characters drawn uniformly from the alphabet by the OS CSPRNG."""
    return "".join(secrets.choice(ALPHABET) for _ in range(length))
