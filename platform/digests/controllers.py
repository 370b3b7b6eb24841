"""Routes: `/admin/tenants/{id}/digest` and `/admin/digests/stuck` (admin keys), and
`/digests/unsubscribe` (a mail link).

The unsubscribe route takes no key: the signed token in the link is the
proof. GET unsubscribes and shows a short page (the link in the mail); POST
does the same for one-click unsubscribe (RFC 8058, `List-Unsubscribe-Post`).
"""

from __future__ import annotations

from html import escape

from litestar import Controller, Response, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.auth.principal import Principal
from hydrant.platform.digests.schemas import (
    DigestResend,
    DigestSettingsUpdate,
    DigestSettingsView,
    StuckDigestList,
    StuckDigestSend,
)
from hydrant.platform.digests.service import DigestService, DigestSettingsService
from hydrant.platform.errors import InvalidRequest

_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Unsubscribed</title></head>
<body style="font-family: Arial, Helvetica, sans-serif; max-width: 36em; margin: 2em auto;">
<h1>Unsubscribed</h1><p>{email} will get no more of these Hydrant emails.</p></body></html>
"""


async def provide_digest_settings_service(
    db_session: NamedDependency[AsyncSession],
) -> DigestSettingsService:
    return DigestSettingsService(db_session)


class DigestAdminController(Controller):
    path = "/admin/tenants/{tenant_id:str}/digest"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "digest_settings": Provide(provide_digest_settings_service),
    }

    @get("/")
    async def get_digest_settings(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        digest_settings: NamedDependency[DigestSettingsService],
    ) -> DigestSettingsView:
        return await digest_settings.view(principal, tenant_id)

    @put("/")
    async def put_digest_settings(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[DigestSettingsUpdate],
        principal: NamedDependency[Principal],
        digest_settings: NamedDependency[DigestSettingsService],
    ) -> DigestSettingsView:
        return await digest_settings.update(principal, tenant_id, data)


class StuckDigestController(Controller):
    """Digest sends a worker left `sending`: list them, and re-send one a person checked."""

    path = "/admin/digests/stuck"
    guards = [require_admin]

    @get("/")
    async def list_stuck(self, digests: NamedDependency[DigestService]) -> StuckDigestList:
        sends = await digests.stuck_sends()
        return StuckDigestList(data=[StuckDigestSend.of(s) for s in sends])

    @post("/{send_id:str}/resend", status_code=200)
    async def resend(
        self, digests: NamedDependency[DigestService], send_id: FromPath[str]
    ) -> DigestResend:
        result = await digests.resend_stuck(send_id)
        return DigestResend(id=send_id, outcome=result.outcome, recipients=result.recipients)


async def _unsubscribe(digests: DigestService, token: str | None) -> Response[str]:
    if not token:
        raise InvalidRequest("the unsubscribe link has no token", param="token")
    who = await digests.unsubscribe(token)
    return Response(_PAGE.format(email=escape(who.email)), media_type="text/html")


class UnsubscribeController(Controller):
    path = "/digests/unsubscribe"

    @get("/")
    async def unsubscribe_link(
        self, digests: NamedDependency[DigestService], token: FromQuery[str | None] = None
    ) -> Response[str]:
        return await _unsubscribe(digests, token)

    @post("/", status_code=200)
    async def unsubscribe_one_click(
        self, digests: NamedDependency[DigestService], token: FromQuery[str | None] = None
    ) -> Response[str]:
        return await _unsubscribe(digests, token)
