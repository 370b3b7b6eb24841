"""A tenant's prepaid credits: its balance and grants; admins also grant and void here.

The same `CreditService` as `/admin/tenants/{id}/credits` and `/account/balance`: a tenant
signed in sees its own balance and grants (another tenant's page is a 404, as on the
invoices page) and no forms; an admin sees any tenant's and may grant or void. The
form is checked as the API's body is (`GrantCreate`: a decimal string of at most 6
places, never a float; a known kind; a 3-letter currency).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.credits.deps import provide_credit_service
from hydrant.platform.credits.schemas import BalanceView, GrantCreate
from hydrant.platform.credits.service import CreditService
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import DomainError, InvalidRequest
from hydrant.platform.tenants.controllers import provide_tenant_service
from hydrant.platform.tenants.service import TenantService
from hydrant.web.context import Page
from hydrant.web.forms import Form, convert, read_form

NOTICES = {
    "granted": "Credit granted: it counts at the tenant's next request.",
    "voided": "Grant voided: what it had paid stays paid; the rest can no longer be spent.",
}


class CreditPagesController(Controller):
    path = "/tenants"
    dependencies = {
        "credit_service": Provide(provide_credit_service),
        "tenants": Provide(provide_tenant_service),
    }

    @get("/{tenant_id:str}/credits")
    async def credits(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        credit_service: NamedDependency[CreditService],
        tenants: NamedDependency[TenantService],
        notice: FromQuery[str | None] = None,
    ) -> Response[str]:
        return await _render(
            page, tenant_id, tenants, credit_service, notice=NOTICES.get(notice or "")
        )

    @post("/{tenant_id:str}/credits")
    async def grant(
        self,
        tenant_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        credit_service: NamedDependency[CreditService],
        tenants: NamedDependency[TenantService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        tenant = await tenants.get(principal, tenant_id)
        try:
            body = convert(  # the API's own body: its patterns and lengths
                GrantCreate,
                {
                    "kind": form.text("kind"),
                    "amount": form.text("amount"),
                    "currency": form.text("currency") or "USD",
                    "expires_at": _expiry(form),
                    "note": form.text("note"),
                },
            )
            amount = body.amount_value()
            await credit_service.grant(
                principal,
                tenant.id,
                kind=body.kind,
                amount=amount,
                currency=body.currency,
                expires_at=body.expires_at,
                note=body.note,
            )
        except DomainError as exc:
            await db_session.rollback()
            return await _render(
                page,
                tenant_id,  # not tenant.id: the rollback expired the row
                tenants,
                credit_service,
                error=exc.message,
                status=exc.status,
                values=form.fields,
            )
        return page.redirect(f"/ui/tenants/{tenant.id}/credits?notice=granted")

    @post("/{tenant_id:str}/credits/{grant_id:str}/void")
    async def void(
        self,
        tenant_id: FromPath[str],
        grant_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        credit_service: NamedDependency[CreditService],
    ) -> Response[str]:
        await read_form(request, page)
        await credit_service.void(page.admin(), tenant_id, grant_id)  # not this tenant's: 404
        return page.redirect(f"/ui/tenants/{tenant_id}/credits?notice=voided")


def _expiry(form: Form) -> datetime | None:
    """The form's date as the CLI's `--expires DATE` reads it: that day's 00:00 UTC."""
    text = form.text("expires_on")
    if not text:
        return None
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise InvalidRequest(
            "expires on must be a date such as 2027-01-31", param="expires_on"
        ) from None
    return day.replace(tzinfo=UTC)


async def _render(
    page: Page,
    tenant_id: str,
    tenants: TenantService,
    credit_service: CreditService,
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
    values: dict[str, str] | None = None,
) -> Response[str]:
    """The page; the tenant read afresh (after a rolled-back grant its row is expired)."""
    principal = page.signed_in()
    tenant = await tenants.get(principal, tenant_id)  # another tenant's id: 404
    balance = BalanceView.of(await credit_service.balance(principal, tenant.id))
    return page.render(
        "credits.html",
        status=status,
        tenant=tenant,
        balance=balance,
        now=utcnow(),
        notice=notice,
        error=error,
        values=values or {},
    )
