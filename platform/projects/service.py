"""Projects: made, renamed, budgeted and archived by admins; read by their tenant.

Archived, never deleted: ledger entries name the project, and a report of last month
must still group by it. An archived project takes no new keys; its existing keys keep
working and keep being attributed to it (revoke them to stop them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.invalidation import CacheInvalidator, no_cache
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Project
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, PermissionDenied
from hydrant.platform.prices.decimal_text import parse_decimal
from hydrant.platform.projects import repository
from hydrant.platform.projects.schemas import ProjectCreate, ProjectUpdate
from hydrant.platform.tenants import repository as tenants
from hydrant.platform.tenants.schemas import changes

_MONEY_FIELDS = ("spend_per_day", "spend_per_month")
_BUDGET_FIELDS = (
    "requests_per_minute",
    "tokens_per_minute",
    "tokens_per_day",
    "tokens_per_month",
    *_MONEY_FIELDS,
)


def _budget_values(fields: Mapping[str, Any]) -> dict[str, Any]:
    values = {name: fields[name] for name in _BUDGET_FIELDS if name in fields}
    for name in _MONEY_FIELDS:
        if values.get(name) is not None:
            values[name] = parse_decimal(values[name], param=name, places=6, integer_digits=14)
    return values


class ProjectService:
    def __init__(self, session: AsyncSession, *, cache: CacheInvalidator = no_cache) -> None:
        self._session = session
        self._cache = cache  # cached principals carry their key's project budgets

    async def create(self, principal: Principal, tenant_id: str, body: ProjectCreate) -> Project:
        self._require_admin(principal)
        await self._tenant(principal, tenant_id)
        name = self._name(body.name)
        await self._unique(tenant_id, name, None)
        fields = {name: getattr(body, name) for name in _BUDGET_FIELDS}
        project = Project(tenant_id=tenant_id, name=name, status="active", **_budget_values(fields))
        self._session.add(project)
        await self._flush()
        return project

    async def get(self, principal: Principal, tenant_id: str, ref: str) -> Project:
        project = await repository.get_project(self._session, principal, tenant_id, ref)
        if project is None:
            raise NotFound(f"no project {ref!r}", param="project_id")
        return project

    async def list(
        self, principal: Principal, tenant_id: str, *, archived: bool = False
    ) -> Sequence[Project]:
        await self._tenant(principal, tenant_id)
        return await repository.list_projects(
            self._session, principal, tenant_id, archived=archived
        )

    async def update(
        self, principal: Principal, tenant_id: str, ref: str, body: ProjectUpdate
    ) -> Project:
        self._require_admin(principal)
        project = await self.get(principal, tenant_id, ref)
        fields = changes(body)
        if "name" in fields:
            name = self._name(str(fields["name"]))
            await self._unique(tenant_id, name, project.id)
            project.name = name
        for column, value in _budget_values(fields).items():
            setattr(project, column, value)
        await self._flush()
        self._cache.clear()
        return project

    async def archive(self, principal: Principal, tenant_id: str, ref: str) -> Project:
        self._require_admin(principal)
        project = await self.get(principal, tenant_id, ref)
        if project.status != "archived":
            project.status = "archived"
            project.archived_at = utcnow()
            await self._flush()
        return project

    async def for_new_key(self, principal: Principal, tenant_id: str, ref: str) -> Project:
        """The project a new key joins: the tenant's own, and active (400 otherwise)."""
        project = await self.get(principal, tenant_id, ref)
        if project.status != "active":
            raise InvalidRequest(f"project {ref!r} is archived", param="project")
        return project

    async def _tenant(self, principal: Principal, tenant_id: str) -> None:
        if await tenants.get_tenant(self._session, principal, tenant_id) is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")

    @staticmethod
    def _name(name: str) -> str:
        name = name.strip()
        if not name:
            raise InvalidRequest("name must not be blank", param="name")
        return name

    async def _unique(self, tenant_id: str, name: str, other_than: str | None) -> None:
        if await repository.name_taken(self._session, tenant_id, name, other_than):
            raise Conflict(f"the tenant already has a project named {name!r}", param="name")

    async def _flush(self) -> None:
        try:
            await self._session.flush()
        except IntegrityError as exc:  # a concurrent create took the name first
            raise Conflict("a project with this name already exists", param="name") from exc

    @staticmethod
    def _require_admin(principal: Principal) -> None:
        if not principal.is_admin:
            raise PermissionDenied("only admin keys can change projects")
