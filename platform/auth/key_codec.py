"""The API key format: `hyd_<env>_<32 random base62><6 base62 CRC32>`.

Why this shape (GitHub's token format): the fixed `hyd_` marker makes a leaked
key findable by secret scanners and by our own log redaction (`KEY_PATTERN`);
the environment tells a test key from a live key at a glance; and the
checksum lets the gateway turn away typos and garbage without touching the
database, so junk traffic never reaches the key table. The checksum is not a
secret and proves nothing about authenticity: only the stored HMAC does.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Literal, cast

from hydrant.errors import HydrantError
from hydrant.platform.auth.base62 import encode_fixed, random_string

KeyEnv = Literal["live", "test"]
ENVIRONMENTS: tuple[KeyEnv, ...] = ("live", "test")
MARKER = "hyd"
RANDOM_LENGTH = 32  # 62**32 is about 2**190: far beyond guessing
CHECKSUM_LENGTH = 6  # 62**6 > 2**32, so any CRC32 fits
PREFIX_RANDOM_LENGTH = 8  # public lookup part; the other 24 characters stay secret
KEY_LENGTH = len(MARKER) + 1 + 4 + 1 + RANDOM_LENGTH + CHECKSUM_LENGTH

_BODY = (
    rf"{MARKER}_(?P<env>live|test)_"
    rf"(?P<random>[0-9A-Za-z]{{{RANDOM_LENGTH}}})(?P<checksum>[0-9A-Za-z]{{{CHECKSUM_LENGTH}}})"
)
# For scanning free text (logs, pastes): a key is not glued to more alphanumerics.
KEY_PATTERN: re.Pattern[str] = re.compile(rf"(?<![0-9A-Za-z]){_BODY}(?![0-9A-Za-z])")
_EXACT = re.compile(_BODY)


class MalformedKeyError(HydrantError):
    """The text is not a well-formed Hydrant key; the message never contains the text."""


@dataclass(frozen=True)
class GeneratedKey:
    """A new key: `secret` is shown to the user once; `prefix` is stored and displayed."""

    secret: str = field(repr=False)
    prefix: str
    env: KeyEnv


@dataclass(frozen=True)
class ParsedKey:
    """A syntactically valid key, split into its parts; not yet authenticated."""

    secret: str = field(repr=False)
    env: KeyEnv
    prefix: str


def _checksum(env: str, random_part: str) -> str:
    body = f"{MARKER}_{env}_{random_part}".encode("ascii")
    return encode_fixed(zlib.crc32(body), CHECKSUM_LENGTH)


def _prefix(env: str, random_part: str) -> str:
    return f"{MARKER}_{env}_{random_part[:PREFIX_RANDOM_LENGTH]}"


def generate_key(env: KeyEnv = "live") -> GeneratedKey:
    """Draw a fresh key; the caller stores `prefix` and the HMAC of `secret`, never `secret`."""
    if env not in ENVIRONMENTS:
        raise ValueError(f"key environment must be one of {', '.join(ENVIRONMENTS)}")
    random_part = random_string(RANDOM_LENGTH)
    secret = f"{MARKER}_{env}_{random_part}{_checksum(env, random_part)}"
    return GeneratedKey(secret=secret, prefix=_prefix(env, random_part), env=env)


def parse_key(text: str) -> ParsedKey:
    """Check format and checksum (no I/O); raise `MalformedKeyError` when either is wrong."""
    if not isinstance(text, str):
        raise MalformedKeyError("an API key must be a string")
    if len(text) != KEY_LENGTH:  # cheap length gate before any regex work on hostile input
        raise MalformedKeyError("the API key has the wrong length")
    match = _EXACT.fullmatch(text)
    if match is None:
        raise MalformedKeyError("the API key is not in the hyd_<env>_<key> format")
    env, random_part = match["env"], match["random"]
    if match["checksum"] != _checksum(env, random_part):
        raise MalformedKeyError("the API key checksum does not match (a typo or a truncated key)")
    return ParsedKey(secret=text, env=cast(KeyEnv, env), prefix=_prefix(env, random_part))


def redact_keys(text: str) -> str:
    """Replace each well-formed key in `text` by its public prefix and an ellipsis."""
    return KEY_PATTERN.sub(lambda m: _prefix(m["env"], m["random"]) + "…", text)
