"""Tenants: the list, creating one, suspending and resuming it, its plan, its keys.

Each action calls the same service as the `/admin/tenants` API; a refusal
(blank name, taken name, unknown plan or time zone) is shown on the page the
form came from, with the status the API would give.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.errors import DomainError
from hydrant.platform.keys.controllers import provide_key_service
from hydrant.platform.keys.schemas import KeyView
from hydrant.platform.keys.service import KeyService
from hydrant.platform.projects.deps import provide_project_service
from hydrant.platform.projects.schemas import ProjectView
from hydrant.platform.projects.service import ProjectService
from hydrant.platform.tenants.controllers import provide_plan_service, provide_tenant_service
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.schemas import TenantCreate, TenantUpdate
from hydrant.platform.tenants.service import TenantService
from hydrant.web.context import Page
from hydrant.web.forms import convert, read_form
from hydrant.web.reveal import Reveal

PAGE_SIZE = 100
NOTICES = {
    "created": "Tenant created.",
    "suspended": "Tenant suspended: its keys are refused until it is activated.",
    "activated": "Tenant activated.",
    "plan": "Plan changed.",
    "revoked": "Key revoked.",
    "budgets": "Key budgets changed: its next request meets them.",
}


class TenantPagesController(Controller):
    path = "/tenants"
    dependencies = {
        "tenants": Provide(provide_tenant_service),
        "plans": Provide(provide_plan_service),
        "keys": Provide(provide_key_service),
        "projects": Provide(provide_project_service),
    }

    @get("/")
    async def list_page(
        self,
        page: NamedDependency[Page],
        tenants: NamedDependency[TenantService],
        plans: NamedDependency[PlanService],
        after: FromQuery[str | None] = None,
        notice: FromQuery[str | None] = None,
    ) -> Response[str]:
        page.admin()
        return await _render_list(page, tenants, plans, after=after, notice=notice)

    @post("/")
    async def create(
        self,
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        tenants: NamedDependency[TenantService],
        plans: NamedDependency[PlanService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        try:
            body = convert(
                TenantCreate,
                {
                    "name": form.text("name"),
                    "contact_email": form.optional("contact_email"),
                    "timezone": form.text("timezone") or "UTC",
                    "plan": form.optional("plan"),
                },
            )
            tenant = await tenants.create(principal, body)
        except DomainError as exc:
            await db_session.rollback()
            return await _render_list(
                page, tenants, plans, error=exc.message, status=exc.status, values=form.fields
            )
        return page.redirect(f"/ui/tenants/{tenant.id}?notice=created")

    @get("/{tenant_id:str}")
    async def detail(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        tenants: NamedDependency[TenantService],
        plans: NamedDependency[PlanService],
        keys: NamedDependency[KeyService],
        projects: NamedDependency[ProjectService],
        notice: FromQuery[str | None] = None,
    ) -> Response[str]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)  # 404 for another tenant's id
        if not principal.is_admin:
            return page.redirect(f"/ui/tenants/{tenant.id}/usage")
        return await _render_detail(page, tenant_id, tenants, plans, keys, projects, notice=notice)

    @post("/{tenant_id:str}/status")
    async def set_status(
        self,
        tenant_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        tenants: NamedDependency[TenantService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        action = form.text("action")
        if action == "suspend":
            await tenants.suspend(principal, tenant_id)
            return page.redirect(f"/ui/tenants/{tenant_id}?notice=suspended")
        if action == "activate":
            await tenants.resume(principal, tenant_id)
            return page.redirect(f"/ui/tenants/{tenant_id}?notice=activated")
        await tenants.get(principal, tenant_id)
        return page.render(
            "error.html", status=400, title="Unknown action", message="Choose suspend or activate."
        )

    @post("/{tenant_id:str}/plan")
    async def set_plan(
        self,
        tenant_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        tenants: NamedDependency[TenantService],
        plans: NamedDependency[PlanService],
        keys: NamedDependency[KeyService],
        projects: NamedDependency[ProjectService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        try:
            await tenants.update(principal, tenant_id, TenantUpdate(plan=form.text("plan")))
        except DomainError as exc:
            if exc.status == 404 and exc.param == "tenant_id":
                raise
            await db_session.rollback()
            return await _render_detail(
                page,
                tenant_id,
                tenants,
                plans,
                keys,
                projects,
                error=exc.message,
                status=exc.status,
            )
        return page.redirect(f"/ui/tenants/{tenant_id}?notice=plan")

    @post("/{tenant_id:str}/keys")
    async def create_key(
        self,
        tenant_id: FromPath[str],
        request: Request[Any, Any, Any],
        page: NamedDependency[Page],
        db_session: NamedDependency[AsyncSession],
        tenants: NamedDependency[TenantService],
        plans: NamedDependency[PlanService],
        keys: NamedDependency[KeyService],
        projects: NamedDependency[ProjectService],
    ) -> Response[str]:
        form = await read_form(request, page)
        principal = page.admin()
        await tenants.get(principal, tenant_id)
        name = form.text("name")
        if len(name) > 200:
            return await _render_detail(
                page,
                tenant_id,
                tenants,
                plans,
                keys,
                projects,
                error="A key name has at most 200 characters.",
                status=400,
            )
        try:
            key, secret = await keys.create(
                principal, tenant_id=tenant_id, name=name, project=form.text("project") or None
            )
        except DomainError as exc:
            await db_session.rollback()
            return await _render_detail(
                page,
                tenant_id,
                tenants,
                plans,
                keys,
                projects,
                error=exc.message,
                status=exc.status,
            )
        return page.reveal_once(Reveal(secret, key.id, key.prefix, key.tenant_id, action="created"))


async def _render_list(
    page: Page,
    tenants: TenantService,
    plans: PlanService,
    *,
    after: str | None = None,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
    values: dict[str, str] | None = None,
) -> Response[str]:
    principal = page.admin()
    rows, more = await tenants.list(principal, limit=PAGE_SIZE, after=after)
    plan_rows, _ = await plans.list(limit=200, after=None)
    return page.render(
        "tenants.html",
        status=status,
        tenants=rows,
        has_more=more,
        next_after=rows[-1].id if more and rows else None,
        plans={p.id: p for p in plan_rows},
        notice=NOTICES.get(notice or ""),
        error=error,
        values=values or {},
    )


async def _render_detail(
    page: Page,
    tenant_id: str,
    tenants: TenantService,
    plans: PlanService,
    keys: KeyService,
    projects: ProjectService,
    *,
    notice: str | None = None,
    error: str | None = None,
    status: int = 200,
) -> Response[str]:
    principal = page.admin()
    tenant = await tenants.get(principal, tenant_id)
    plan = await tenants.plan_of(tenant)
    plan_rows, _ = await plans.list(limit=200, after=None)
    key_rows, more_keys = await keys.list(principal, tenant_id=tenant.id, limit=200)
    project_rows = await projects.list(principal, tenant.id, archived=True)
    now = keys.now()
    return page.render(
        "tenant.html",
        status=status,
        tenant=tenant,
        plan=plan,
        plans=plan_rows,
        keys=[KeyView.of(k, now) for k in key_rows],
        more_keys=more_keys,
        projects=[ProjectView.of(p) for p in project_rows],
        project_names={p.id: p.name for p in project_rows},
        notice=NOTICES.get(notice or ""),
        error=error,
    )
