"""Reading a posted form: the CSRF check first, then plain text fields.

Every `/ui` handler that takes a form reads it through `read_form`, so no
form can skip the check (a test posts to every `/ui` POST route without a
token and expects 403).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec
from litestar import Request
from litestar.exceptions import HTTPException

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.prices.decimal_text import DECIMAL_PATTERN
from hydrant.web.context import Page

MAX_FIELD_CHARS = 2000
S = TypeVar("S", bound=msgspec.Struct)
_TOO_LONG = re.compile(r"Expected `str` of length <= (\d+)")


class Form:
    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def text(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default).strip()

    def optional(self, name: str) -> str | None:
        return self.text(name) or None

    def integer(self, name: str, *, label: str, default: int | None = None) -> int:
        raw = self.text(name)
        if not raw and default is not None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise InvalidRequest(f"{label} must be a whole number", param=name) from None


async def read_form(request: Request[Any, Any, Any], page: Page) -> Form:
    raw: Mapping[str, Any]
    try:
        raw = await request.form()
    except HTTPException:
        raise  # e.g. 413: the body is too large, said as such
    except Exception:  # a body that is not a form: treated like a form without a token
        raw = {}
    fields: dict[str, str] = {}
    for name, value in dict(raw).items():
        if isinstance(value, str):
            fields[name] = value[:MAX_FIELD_CHARS]
    page.check_csrf(fields)
    return Form(fields)


def convert(kind: type[S], data: dict[str, object]) -> S:
    """A request body built from form fields with the API's own validation (lengths, patterns)."""
    try:
        return msgspec.convert(data, kind, strict=False)
    except msgspec.ValidationError as exc:
        text = str(exc)
        message, _, where = text.partition(" - at `$.")
        field = where.rstrip("`") or None
        label = field.replace("_", " ") if field else "the form"
        if message == "Expected `str` of length >= 1":
            message = "must not be blank"
        elif (longest := _TOO_LONG.fullmatch(message)) is not None:
            message = f"has at most {longest.group(1)} characters"
        elif message == f"Expected `str` matching regex {DECIMAL_PATTERN!r}":
            message = "must be a number such as 2.50 (digits and a point, no sign)"
        raise InvalidRequest(f"{label}: {message}", param=field) from None
