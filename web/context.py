"""Who is looking at a page, and the response helpers every page shares.

`provide_page` runs for each `/ui` request: it reads the signed session
cookie, looks the key up again through the auth repository (so a revoked or
expired key, or a suspended tenant, ends the session at once), and hands the
handler a `Page` that renders templates with the CSRF token and sets the
cookies with the right flags (HttpOnly, SameSite=Lax, Secure behind TLS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from litestar import Request, Response
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.context import authenticator_of
from hydrant.platform.auth.principal import ADMIN_SCOPE, Principal
from hydrant.platform.auth.repository import find_key_record
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.auth.service import _principal as principal_of_record
from hydrant.web import csrf
from hydrant.web.rendering import render_template
from hydrant.web.reveal import REVEAL_PATH, Reveal, cookie_name, seal, unseal
from hydrant.web.reveal import TTL_S as REVEAL_TTL_S
from hydrant.web.session import (
    CSRF_COOKIE,
    SESSION_COOKIE,
    SESSION_LIFETIME_S,
    SessionData,
    decode_session,
    derive_key,
    encode_session,
    is_secure_request,
)

# Pages are private and change with every action: never cached, never framed.
SECURITY_HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "content-security-policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self';"
        " form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


class SignInRequired(Exception):
    """No valid session: pages redirect to the sign-in form."""


class AdminOnly(Exception):
    """A tenant session on an admin page."""


class CsrfRefused(Exception):
    """A form post without a valid CSRF token."""


@dataclass(frozen=True)
class WebKeys:
    session: bytes
    csrf: bytes
    reveal: bytes  # AES-256-GCM key of the cookie that carries a new key's secret

    @classmethod
    def of(cls, authenticator: Authenticator) -> WebKeys:
        secret = authenticator.server_secret
        return cls(
            session=derive_key(secret, "session"),
            csrf=derive_key(secret, "csrf"),
            reveal=derive_key(secret, "reveal"),
        )


@dataclass
class Page:
    request: Request[Any, Any, Any]
    keys: WebKeys
    secure: bool
    csrf_cookie: str
    principal: Principal | None = None
    session: SessionData | None = None
    # Cookies to send with whatever response this request ends with.
    cookies: list[Cookie] = field(default_factory=list)

    @property
    def sid(self) -> str:
        return self.session.sid if self.session is not None else ""

    @property
    def csrf_token(self) -> str:
        return csrf.token_for(self.keys.csrf, self.csrf_cookie, self.sid)

    @property
    def is_admin(self) -> bool:
        return self.principal is not None and self.principal.is_admin

    def signed_in(self) -> Principal:
        if self.principal is None:
            raise SignInRequired
        return self.principal

    def admin(self) -> Principal:
        principal = self.signed_in()
        if not principal.is_admin:
            raise AdminOnly
        return principal

    def check_csrf(self, form: Mapping[str, Any]) -> None:
        submitted = form.get(csrf.FIELD) or self.request.headers.get(csrf.HEADER)
        cookie = self.request.cookies.get(CSRF_COOKIE)
        if not csrf.token_valid(self.keys.csrf, cookie, self.sid, submitted):
            raise CsrfRefused

    def cookie(self, name: str, value: str, *, max_age: int | None, path: str = "/ui") -> Cookie:
        return Cookie(
            key=name,
            value=value,
            path=path,
            httponly=True,
            samesite="lax",
            secure=self.secure,
            max_age=max_age,
        )

    def start_session(self, principal: Principal, scope: str) -> None:
        """A fresh session (and CSRF cookie), so nothing from before sign-in carries over."""
        self.session = SessionData.new(
            key_id=principal.key_id, prefix=principal.key_prefix, scope=scope
        )
        self.principal = principal
        self.csrf_cookie = csrf.new_cookie_value()
        value = encode_session(self.session, self.keys.session)
        self.cookies = [
            self.cookie(SESSION_COOKIE, value, max_age=SESSION_LIFETIME_S),
            self.cookie(CSRF_COOKIE, self.csrf_cookie, max_age=None),
        ]

    def end_session(self) -> None:
        self.session = None
        self.principal = None
        self.cookies = [self.cookie(SESSION_COOKIE, "", max_age=0)]

    def render(self, template: str, *, status: int = 200, **context: Any) -> Response[str]:
        html = render_template(
            template,
            page=self,
            principal=self.principal,
            csrf_field=csrf.FIELD,
            csrf_token=self.csrf_token,
            path=self.request.url.path,
            **context,
        )
        return self.respond(Response(html, status_code=status, media_type="text/html"))

    def reveal_once(self, reveal: Reveal) -> Response[str]:
        """Redirect to the one showing of a new key's secret, which travels sealed in a cookie."""
        token, sealed = seal(reveal, key=self.keys.reveal, sid=self.sid)
        self.cookies.append(
            self.cookie(cookie_name(token), sealed, max_age=REVEAL_TTL_S, path=REVEAL_PATH)
        )
        return self.redirect(f"{REVEAL_PATH}/{token}")

    def take_reveal(self, token: str) -> Reveal | None:
        """The secret for the reveal page `token`, once: its cookie is deleted as it is read."""
        name = cookie_name(token)
        value = self.request.cookies.get(name)
        if value is not None:
            self.cookies.append(self.cookie(name, "", max_age=0, path=REVEAL_PATH))
        return unseal(value, key=self.keys.reveal, sid=self.sid, token=token)

    def redirect(self, location: str) -> Response[str]:
        return self.respond(
            Response("", status_code=303, headers={"location": location}, media_type="text/html")
        )

    def respond(self, response: Response[Any]) -> Response[Any]:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        for cookie in self.cookies:
            response.set_cookie(cookie)
        return response


def sign_in_url(next_path: str) -> str:
    return f"/ui/sign-in?next={quote(next_path, safe='/')}"


def safe_next(value: str | None) -> str | None:
    """Only a path inside `/ui`: a `next` parameter must never redirect off-site."""
    if not value or not value.startswith("/ui") or value.startswith("//") or "\\" in value:
        return None
    return value


async def load_principal(
    db_session: AsyncSession, authenticator: Authenticator, data: SessionData
) -> Principal | None:
    """The session's key, checked as the authenticator checks it, or None."""
    record = await find_key_record(db_session, data.prefix)
    if record is None or record.key_id != data.key_id:
        return None
    if not record.usable_at(authenticator.clock()) or not record.tenant_active:
        return None
    if data.scope not in record.scopes:
        return None
    principal = principal_of_record(record)
    if data.scope != ADMIN_SCOPE and principal.is_admin:
        return None  # never widen a session beyond the scope it signed in with
    return principal


async def provide_page(
    request: Request[Any, Any, Any],
    db_session: NamedDependency[AsyncSession],
    authenticator: NamedDependency[Authenticator],
) -> Page:
    page = page_without_session(request)
    data = decode_session(request.cookies.get(SESSION_COOKIE), page.keys.session)
    if data is not None:
        principal = await load_principal(db_session, authenticator, data)
        if principal is not None:
            page.session, page.principal = data, principal
    return page


def page_without_session(request: Request[Any, Any, Any]) -> Page:
    """The page as an anonymous visitor sees it (also used by the error handlers)."""
    cached = request.scope.get("state", {}).get("hydrant_web_page")
    if isinstance(cached, Page):
        return cached
    keys = WebKeys.of(authenticator_of(request.app))  # error pages: no injection
    secure = is_secure_request(request.url.scheme, request.headers.get("x-forwarded-proto"))
    cookie_value = request.cookies.get(CSRF_COOKIE)
    page = Page(request=request, keys=keys, secure=secure, csrf_cookie=cookie_value or "")
    if not cookie_value:
        page.csrf_cookie = csrf.new_cookie_value()
        page.cookies.append(page.cookie(CSRF_COOKIE, page.csrf_cookie, max_age=None))
    request.scope.setdefault("state", {})["hydrant_web_page"] = page
    return page
