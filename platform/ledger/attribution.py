"""Who below the tenant a request is for: its key's project, a hashed end user, its tags.

Why checked so narrowly: tags and the end-user id are free text a client sends with
every request, and a ledger that grouped by them must never become a copy of prompts.
Tag keys and values are short words from a small charset (no spaces), at most
`MAX_TAGS` of them; the end-user id is stored only as an HMAC under the server secret
(keyed per tenant), so the raw id never reaches the database, and the same `user` of
two tenants never matches.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.server_secret import derive_key

MAX_TAGS = 10
MAX_TAG_KEY = 64
MAX_TAG_VALUE = 64
MAX_END_USER = 256
TAGS_HEADER = "x-hydrant-tags"
TAG_KEY = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_TAG_VALUE = re.compile(r"[A-Za-z0-9_.:/@+\-]{1,64}")
_END_USER = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII, no spaces
END_USER_LABEL = "ledger-end-user"


@dataclass(frozen=True)
class Attribution:
    """What a ledger entry records below the tenant; every part optional."""

    project_id: str | None = None
    end_user: str | None = None  # the HMAC hex digest, never the raw id
    tags: Mapping[str, str] | None = None


def check_tags(tags: Any, param: str) -> dict[str, str]:
    """`tags` as a checked flat mapping, or a 400 naming `param`."""
    if not isinstance(tags, Mapping):
        raise InvalidRequest(f"`{param}` must be an object of string keys and values", param=param)
    if len(tags) > MAX_TAGS:
        raise InvalidRequest(
            f"`{param}` holds {len(tags)} tags; at most {MAX_TAGS} are allowed", param=param
        )
    checked: dict[str, str] = {}
    for key, value in tags.items():
        if not isinstance(key, str) or TAG_KEY.fullmatch(key) is None:
            raise InvalidRequest(
                f"`{param}` tag keys must be 1-{MAX_TAG_KEY} characters of letters, digits,"
                f" `_`, `.` or `-` (got {str(key)[:MAX_TAG_KEY]!r})",
                param=param,
            )
        if not isinstance(value, str) or _TAG_VALUE.fullmatch(value) is None:
            raise InvalidRequest(
                f"`{param}` tag `{key}` must be a string of 1-{MAX_TAG_VALUE} letters, digits"
                " or `_ . : / @ + -` (no spaces: tags are labels, not text)",
                param=param,
            )
        checked[key] = value
    return checked


def parse_tags_header(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (the `x-hydrant-tags` header) as checked tags."""
    tags: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidRequest(
                f"`{TAGS_HEADER}` must be `key=value` pairs separated by commas", param=TAGS_HEADER
            )
        tags[key.strip()] = value.strip()
    return check_tags(tags, TAGS_HEADER)


def merge_tags(metadata: Any, header: str | None) -> dict[str, str] | None:
    """The request's tags: its `metadata` and the header's (the header wins a shared key)."""
    tags = check_tags(metadata, "metadata") if metadata is not None else {}
    if header is not None:
        tags.update(parse_tags_header(header))
        if len(tags) > MAX_TAGS:
            raise InvalidRequest(
                f"`metadata` and `{TAGS_HEADER}` together hold {len(tags)} tags;"
                f" at most {MAX_TAGS} are allowed",
                param=TAGS_HEADER,
            )
    return tags or None


class EndUserHasher:
    """HMAC-SHA256 of a tenant's end-user id under a key derived from the server secret."""

    def __init__(self, server_secret: Callable[[], bytes]) -> None:
        self._secret = server_secret
        self._key: bytes | None = None

    def hash(self, tenant_id: str, end_user: str, param: str = "user") -> str:
        if _END_USER.fullmatch(end_user) is None:
            raise InvalidRequest(
                f"`{param}` must be 1-{MAX_END_USER} printable characters without spaces"
                " (an id for the end user, not text about them)",
                param=param,
            )
        if self._key is None:
            self._key = derive_key(self._secret(), END_USER_LABEL)
        message = f"{tenant_id}\x00{end_user}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
