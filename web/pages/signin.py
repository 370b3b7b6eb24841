"""Sign-in with an API key, sign-out, and the front door `/ui`.

The key is checked by the platform's authenticator (the same code that
checks a bearer key on `/admin` and `/v1`): an admin key opens the admin
pages, a tenant's inference key opens that tenant's usage pages only.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromQuery, QueryParameter

from hydrant.platform.auth.context import authenticator_of
from hydrant.platform.auth.dependencies import authenticate_guarded
from hydrant.platform.auth.principal import ADMIN_SCOPE, INFERENCE_SCOPE, Principal
from hydrant.platform.errors import DomainError, PermissionDenied, RateLimited
from hydrant.web.context import Page, safe_next
from hydrant.web.forms import read_form

NOT_ACCEPTED = "That key was not accepted. Check that you pasted all of it."


def home_of(principal: Principal) -> str:
    if principal.is_admin:
        return "/ui/reports/costs"
    return f"/ui/tenants/{principal.tenant_id}/usage"


class SignInController(Controller):
    path = "/"

    @get("/", name="web-home")
    async def home(self, page: NamedDependency[Page]) -> Response[str]:
        if page.principal is None:
            return page.redirect("/ui/sign-in")
        return page.redirect(home_of(page.principal))

    @get("/sign-in")
    async def sign_in_form(
        self,
        page: NamedDependency[Page],
        next_path: Annotated[str | None, QueryParameter(name="next")] = None,
        signed_out: FromQuery[str | None] = None,
    ) -> Response[str]:
        return page.render(
            "sign_in.html",
            next_path=safe_next(next_path) or "",
            notice="You are signed out." if signed_out else None,
            error=None,
        )

    @post("/sign-in")
    async def sign_in(
        self, request: Request[Any, Any, Any], page: NamedDependency[Page]
    ) -> Response[str]:
        form = await read_form(request, page)
        key = form.text("api_key")
        next_path = safe_next(form.text("next")) or ""
        if not key:
            return page.render(
                "sign_in.html",
                status=400,
                next_path=next_path,
                notice=None,
                error="Enter an API key.",
            )
        try:
            principal, scope = await _authenticate(request, key)
        except DomainError as exc:
            shown = isinstance(exc, PermissionDenied | RateLimited)  # the rest: one message
            message = exc.message if shown else NOT_ACCEPTED
            return page.render(
                "sign_in.html",
                status=exc.status if exc.status in (401, 403, 429) else 400,
                next_path=next_path,
                notice=None,
                error=message,
            )
        page.start_session(principal, scope)
        return page.redirect(next_path if principal.is_admin and next_path else home_of(principal))

    @post("/sign-out")
    async def sign_out(
        self, request: Request[Any, Any, Any], page: NamedDependency[Page]
    ) -> Response[str]:
        await read_form(request, page)
        page.end_session()
        return page.redirect("/ui/sign-in?signed_out=1")


async def _authenticate(request: Request[Any, Any, Any], key: str) -> tuple[Principal, str]:
    """An admin key, or else a tenant's inference key: (principal, the scope it signed in with)."""
    header = f"Bearer {key}"
    try:
        # Through the brute-force guard, like a bearer header: guesses made on this form
        # count against their source and a blocked source is refused here too.
        return await authenticate_guarded(request, header, ADMIN_SCOPE), ADMIN_SCOPE
    except PermissionDenied as exc:
        if exc.code != "insufficient_scope":
            raise
    # The key is valid (only its scope was wrong): no guess to count on the second look.
    authenticator = authenticator_of(request.app)
    return await authenticator.authenticate(header, INFERENCE_SCOPE), INFERENCE_SCOPE
