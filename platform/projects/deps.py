"""How the project service is made, with the authenticator's key cache (budgets are cached
on principals, so a changed budget reaches the hot path at once)."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.service import Authenticator
from hydrant.platform.projects.service import ProjectService


async def provide_project_service(
    db_session: NamedDependency[AsyncSession], authenticator: NamedDependency[Authenticator]
) -> ProjectService:
    return ProjectService(db_session, cache=authenticator.cache)
