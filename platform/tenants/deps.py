"""How the tenant and plan services are made: one place for the admin API and the console.

Both get the authenticator's key cache, so a suspended tenant or a changed
plan reaches the hot path at once instead of after the cache's TTL.
"""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.service import Authenticator
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.service import TenantService


async def provide_tenant_service(
    db_session: NamedDependency[AsyncSession], authenticator: NamedDependency[Authenticator]
) -> TenantService:
    return TenantService(db_session, cache=authenticator.cache)


async def provide_plan_service(
    db_session: NamedDependency[AsyncSession], authenticator: NamedDependency[Authenticator]
) -> PlanService:
    return PlanService(db_session, cache=authenticator.cache)
