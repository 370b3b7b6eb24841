"""How the adapter service is made: one place for the admin API and the console."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.adapters.catalog import AdapterCatalog
from hydrant.platform.adapters.service import AdapterService
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.prices.service import PriceService


async def provide_adapter_service(
    db_session: NamedDependency[AsyncSession],
    authenticator: NamedDependency[Authenticator],
    adapter_catalog: NamedDependency[AdapterCatalog | None],
) -> AdapterService:
    """With this gateway's catalog (None where it serves no `/v1`, and at the console)."""
    prices = PriceService(db_session, clock=authenticator.clock)
    return AdapterService(db_session, prices, adapter_catalog)
