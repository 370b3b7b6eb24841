"""Keys: revoke, rotate, change a key's own budgets, and the one showing of a new key's
secret."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.keys.controllers import provide_key_service
from hydrant.platform.keys.schemas import DEFAULT_GRACE_S, KEY_BUDGETS, MAX_GRACE_S, KeyUpdate
from hydrant.platform.keys.service import KeyService
from hydrant.web.context import Page
from hydrant.web.forms import convert, read_form
from hydrant.web.reveal import Reveal


class KeyPagesController(Controller):
    path = "/keys"
    dependencies = {"keys": Provide(provide_key_service)}

    @post("/{key_id:str}/revoke")
    async def revoke(
        self,
        key_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        keys: NamedDependency[KeyService],
    ) -> Response[str]:
        await read_form(request, page)
        key = await keys.revoke(page.admin(), key_id)
        return page.redirect(_back_to(key.tenant_id, "revoked"))

    @post("/{key_id:str}/rotate")
    async def rotate(
        self,
        key_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        keys: NamedDependency[KeyService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        hours = form.integer(
            "grace_hours", label="The grace period (hours)", default=DEFAULT_GRACE_S // 3600
        )
        if not 0 <= hours * 3600 <= MAX_GRACE_S:
            raise InvalidRequest(
                f"The grace period is 0 to {MAX_GRACE_S // 3600} hours", param="grace_hours"
            )
        new, secret, _old = await keys.rotate(principal, key_id, grace=timedelta(hours=hours))
        return page.reveal_once(Reveal(secret, new.id, new.prefix, new.tenant_id, action="rotated"))

    @post("/{key_id:str}/budgets")
    async def budgets(
        self,
        key_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        keys: NamedDependency[KeyService],
    ) -> Response[str]:
        """All four budgets as the form shows them: a blank field clears its budget (the
        form always posts every field, unlike the API's PATCH, where absent is unchanged)."""
        form = await read_form(request, page)
        principal = page.admin()
        body = convert(KeyUpdate, {name: form.optional(name) for name in KEY_BUDGETS})
        key = await keys.update_budgets(principal, key_id, body.budgets())
        return page.redirect(_back_to(key.tenant_id, "budgets"))

    @get("/shown/{token:str}")
    async def shown(self, token: FromPath[str], page: NamedDependency[Page]) -> Response[str]:
        page.admin()
        reveal = page.take_reveal(token)
        if reveal is None:
            return page.render(
                "key_gone.html",
                status=410,
                title="This key has already been shown",
            )
        return page.render("key_shown.html", reveal=reveal, title="Your new key")


def _back_to(tenant_id: str | None, notice: str) -> str:
    return f"/ui/tenants/{tenant_id}?notice={notice}" if tenant_id else "/ui/tenants"
