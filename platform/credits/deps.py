"""How the credit service is made: one place for the admin API and the account API."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.credits.service import CreditService
from hydrant.platform.db.session import Database


async def provide_credit_service(
    db_session: NamedDependency[AsyncSession], database: NamedDependency[Database]
) -> CreditService:
    return CreditService(db_session, database)
