"""How the price-book service is made: one place for the admin API and the console."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.service import Authenticator
from hydrant.platform.prices.service import PriceService


async def provide_price_service(
    db_session: NamedDependency[AsyncSession], authenticator: NamedDependency[Authenticator]
) -> PriceService:
    return PriceService(db_session, clock=authenticator.clock)
