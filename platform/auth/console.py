"""The control-plane services outside a request: for the console and for jobs.

Same services as the admin API, on one session of the configured database
(one unit of work: committed when the block succeeds), acting as the console
principal. Why not copies of the service logic: a rule changed in a service
must hold at the console too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from hydrant.platform.auth.principal import CONSOLE, Principal
from hydrant.platform.auth.secret import load_server_secret
from hydrant.platform.db.session import Database
from hydrant.platform.keys.service import KeyService
from hydrant.platform.prices.service import PriceService
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.service import TenantService
from hydrant.settings import Settings


@dataclass
class AdminServices:
    principal: Principal
    tenants: TenantService
    plans: PlanService
    keys: KeyService
    prices: PriceService


@asynccontextmanager
async def admin_services(settings: Settings) -> AsyncIterator[AdminServices]:
    database = Database(settings.effective_database_url)
    try:
        async with database.session() as session:
            yield AdminServices(
                principal=CONSOLE,
                tenants=TenantService(session),
                plans=PlanService(session),
                keys=KeyService(
                    session, server_secret=load_server_secret(settings), key_env=settings.key_env
                ),
                prices=PriceService(session),
            )
    finally:
        await database.dispose()
