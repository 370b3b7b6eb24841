"""Routes: `/admin/tenants`, `/admin/plans` (admin keys) and `/account` (a tenant's own key)."""

from __future__ import annotations

from litestar import Controller, get, patch, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
    require_inference,
)
from hydrant.platform.auth.principal import Principal
from hydrant.platform.tenants.deps import provide_plan_service, provide_tenant_service
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.schemas import (
    AccountView,
    PlanCreate,
    PlanList,
    PlanUpdate,
    PlanView,
    TenantCreate,
    TenantList,
    TenantUpdate,
    TenantView,
)
from hydrant.platform.tenants.service import TenantService


class TenantAdminController(Controller):
    path = "/admin/tenants"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "tenants": Provide(provide_tenant_service),
    }

    @post("/")
    async def create_tenant(
        self,
        data: JSONBody[TenantCreate],
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
    ) -> TenantView:
        return TenantView.of(await tenants.create(principal, data))

    @get("/")
    async def list_tenants(
        self,
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
        limit: FromQuery[int] = 50,
        after: FromQuery[str | None] = None,
        status: FromQuery[str | None] = None,
    ) -> TenantList:
        rows, more = await tenants.list(principal, limit=limit, after=after, status=status)
        return TenantList(data=[TenantView.of(t) for t in rows], has_more=more)

    @get("/{tenant_id:str}")
    async def get_tenant(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
    ) -> TenantView:
        return TenantView.of(await tenants.get(principal, tenant_id))

    @patch("/{tenant_id:str}")
    async def update_tenant(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[TenantUpdate],
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
    ) -> TenantView:
        return TenantView.of(await tenants.update(principal, tenant_id, data))

    @post("/{tenant_id:str}/suspend", status_code=200)
    async def suspend_tenant(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
    ) -> TenantView:
        return TenantView.of(await tenants.suspend(principal, tenant_id))

    @post("/{tenant_id:str}/resume", status_code=200)
    async def resume_tenant(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        tenants: NamedDependency[TenantService],
    ) -> TenantView:
        return TenantView.of(await tenants.resume(principal, tenant_id))


class PlanAdminController(Controller):
    path = "/admin/plans"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "plans": Provide(provide_plan_service),
    }

    @post("/")
    async def create_plan(
        self, data: JSONBody[PlanCreate], plans: NamedDependency[PlanService]
    ) -> PlanView:
        return PlanView.of(await plans.create(data))

    @get("/")
    async def list_plans(
        self,
        plans: NamedDependency[PlanService],
        limit: FromQuery[int] = 50,
        after: FromQuery[str | None] = None,
    ) -> PlanList:
        rows, more = await plans.list(limit=limit, after=after)
        return PlanList(data=[PlanView.of(p) for p in rows], has_more=more)

    @get("/{plan_id:str}")
    async def get_plan(
        self, plan_id: FromPath[str], plans: NamedDependency[PlanService]
    ) -> PlanView:
        return PlanView.of(await plans.get(plan_id))

    @patch("/{plan_id:str}")
    async def update_plan(
        self,
        plan_id: FromPath[str],
        data: JSONBody[PlanUpdate],
        plans: NamedDependency[PlanService],
    ) -> PlanView:
        return PlanView.of(await plans.update(plan_id, data))


class AccountController(Controller):
    """A tenant reading its own record and plan with one of its inference keys."""

    path = "/account"
    guards = [require_inference]
    # `principal` is the app-wide provider: the inference principal (see app.py).
    dependencies = {
        "tenants": Provide(provide_tenant_service),
    }

    @get("/")
    async def get_account(
        self, principal: NamedDependency[Principal], tenants: NamedDependency[TenantService]
    ) -> AccountView:
        tenant = await tenants.get(principal, principal.tenant_id or "")
        plan = await tenants.plan_of(tenant)
        return AccountView(tenant=TenantView.of(tenant), plan=PlanView.of(plan))
