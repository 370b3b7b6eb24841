"""Driving the pages like a browser would: read the CSRF token from a form, post forms."""

from __future__ import annotations

import re
from typing import Any

import httpx

CSRF_INPUT = re.compile(r'name="csrf_token" value="([0-9a-f]{64})"')


def csrf_token(html: str) -> str:
    match = CSRF_INPUT.search(html)
    assert match is not None, "the page has no form with a CSRF token"
    return match.group(1)


async def page_token(client: Any, path: str) -> str:
    response = await client.get(path)
    assert response.status_code == 200, response.text
    return csrf_token(response.text)


async def post_form(client: Any, path: str, data: dict[str, str], *, token_from: str) -> Any:
    """Post `data` with the CSRF token of the form on page `token_from`."""
    token = await page_token(client, token_from)
    return await client.post(path, data={**data, "csrf_token": token})


async def sign_in(client: Any, key: str) -> httpx.Response:
    response = await post_form(client, "/ui/sign-in", {"api_key": key}, token_from="/ui/sign-in")
    return response  # type: ignore[no-any-return]


def set_cookie_headers(response: httpx.Response) -> dict[str, str]:
    """`Set-Cookie` headers by cookie name (the whole header line, flags included)."""
    headers = {}
    for line in response.headers.get_list("set-cookie"):
        name = line.split("=", 1)[0].strip()
        headers[name] = line
    return headers
