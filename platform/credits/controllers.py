"""Routes: `/admin/tenants/{id}/credits` (grant, list, void, low-balance alert thresholds)
and `/account/balance`."""

from __future__ import annotations

from litestar import Controller, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
    require_inference,
)
from hydrant.platform.auth.principal import Principal
from hydrant.platform.credits.deps import provide_credit_service
from hydrant.platform.credits.schemas import (
    AlertThresholdsUpdate,
    AlertThresholdsView,
    BalanceView,
    GrantCreate,
    GrantView,
)
from hydrant.platform.credits.service import CreditService
from hydrant.platform.prices.decimal_text import parse_decimal


class CreditAdminController(Controller):
    path = "/admin/tenants/{tenant_id:str}/credits"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "credit_service": Provide(provide_credit_service),
    }

    @post("/", status_code=201)
    async def grant_credits(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[GrantCreate],
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> GrantView:
        amount = data.amount_value()
        row, left = await credit_service.grant(
            principal,
            tenant_id,
            kind=data.kind,
            amount=amount,
            currency=data.currency,
            expires_at=data.expires_at,
            note=data.note,
        )
        return GrantView.of(row, left)

    @get("/")
    async def list_credits(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> BalanceView:
        return BalanceView.of(await credit_service.balance(principal, tenant_id))

    @post("/{grant_id:str}/void", status_code=200)
    async def void_credits(
        self,
        tenant_id: FromPath[str],
        grant_id: FromPath[str],
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> GrantView:
        return GrantView.of(*await credit_service.void(principal, tenant_id, grant_id))

    @get("/alerts")
    async def get_alert_thresholds(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> AlertThresholdsView:
        currency, rows = await credit_service.alert_thresholds(principal, tenant_id)
        return AlertThresholdsView.of(tenant_id, currency, rows)

    @put("/alerts")
    async def set_alert_thresholds(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[AlertThresholdsUpdate],
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> AlertThresholdsView:
        amounts = [
            parse_decimal(a, param="thresholds", places=6, integer_digits=10, positive=True)
            for a in data.thresholds
        ]
        currency, rows = await credit_service.set_alert_thresholds(principal, tenant_id, amounts)
        return AlertThresholdsView.of(tenant_id, currency, rows)


class AccountBalanceController(Controller):
    """A tenant reading its own credits with one of its inference keys."""

    path = "/account/balance"
    guards = [require_inference]
    # `principal` is the app-wide provider: the inference principal (see app.py).
    dependencies = {"credit_service": Provide(provide_credit_service)}

    @get("/")
    async def get_balance(
        self,
        principal: NamedDependency[Principal],
        credit_service: NamedDependency[CreditService],
    ) -> BalanceView:
        return BalanceView.of(await credit_service.balance(principal, principal.tenant_id or ""))
