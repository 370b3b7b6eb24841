"""Project queries, every one scoped to the caller (`scope_to`): another tenant's project
does not match, so it answers 404 like one that does not exist."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to
from hydrant.platform.db.models import Project


async def get_project(
    session: AsyncSession, principal: Principal, tenant_id: str, ref: str
) -> Project | None:
    """A tenant's project by id or name."""
    statement = select(Project).where(
        Project.tenant_id == tenant_id, or_(Project.id == ref, Project.name == ref)
    )
    return await session.scalar(scope_to(statement, Project, principal))


async def list_projects(
    session: AsyncSession, principal: Principal, tenant_id: str, *, archived: bool
) -> Sequence[Project]:
    statement = select(Project).where(Project.tenant_id == tenant_id)
    if not archived:
        statement = statement.where(Project.status == "active")
    statement = scope_to(statement, Project, principal).order_by(Project.created_at, Project.id)
    return (await session.scalars(statement)).all()


async def name_taken(
    session: AsyncSession, tenant_id: str, name: str, other_than: str | None
) -> bool:
    statement = select(Project.id).where(Project.tenant_id == tenant_id, Project.name == name)
    if other_than is not None:
        statement = statement.where(Project.id != other_than)
    return await session.scalar(statement) is not None
