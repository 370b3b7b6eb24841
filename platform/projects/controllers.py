"""Routes: `/admin/tenants/{tenant_id}/projects` (admin keys) and `/account/projects` (a
tenant reading its own projects with one of its inference keys)."""

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
from hydrant.platform.projects.deps import provide_project_service
from hydrant.platform.projects.schemas import (
    ProjectCreate,
    ProjectList,
    ProjectUpdate,
    ProjectView,
)
from hydrant.platform.projects.service import ProjectService


class ProjectAdminController(Controller):
    path = "/admin/tenants/{tenant_id:str}/projects"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "projects": Provide(provide_project_service),
    }

    @post("/")
    async def create_project(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[ProjectCreate],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
    ) -> ProjectView:
        return ProjectView.of(await projects.create(principal, tenant_id, data))

    @get("/")
    async def list_projects(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
        archived: FromQuery[bool] = False,
    ) -> ProjectList:
        rows = await projects.list(principal, tenant_id, archived=archived)
        return ProjectList(data=[ProjectView.of(p) for p in rows])

    @get("/{project_id:str}")
    async def get_project(
        self,
        tenant_id: FromPath[str],
        project_id: FromPath[str],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
    ) -> ProjectView:
        return ProjectView.of(await projects.get(principal, tenant_id, project_id))

    @patch("/{project_id:str}")
    async def update_project(
        self,
        tenant_id: FromPath[str],
        project_id: FromPath[str],
        data: JSONBody[ProjectUpdate],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
    ) -> ProjectView:
        return ProjectView.of(await projects.update(principal, tenant_id, project_id, data))

    @post("/{project_id:str}/archive", status_code=200)
    async def archive_project(
        self,
        tenant_id: FromPath[str],
        project_id: FromPath[str],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
    ) -> ProjectView:
        return ProjectView.of(await projects.archive(principal, tenant_id, project_id))


class AccountProjectsController(Controller):
    """A tenant's own projects (archived included): scoped to the key's tenant."""

    path = "/account/projects"
    guards = [require_inference]
    # `principal` is the app-wide provider: the inference principal (see app.py).
    dependencies = {"projects": Provide(provide_project_service)}

    @get("/")
    async def list_own_projects(
        self, principal: NamedDependency[Principal], projects: NamedDependency[ProjectService]
    ) -> ProjectList:
        rows = await projects.list(principal, principal.tenant_id or "", archived=True)
        return ProjectList(data=[ProjectView.of(p) for p in rows])

    @get("/{project_id:str}")
    async def get_own_project(
        self,
        project_id: FromPath[str],
        principal: NamedDependency[Principal],
        projects: NamedDependency[ProjectService],
    ) -> ProjectView:
        return ProjectView.of(await projects.get(principal, principal.tenant_id or "", project_id))
