"""How the billing customer service is made: one place for the admin API and the console."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.usage_export.service import BillingCustomerService


async def provide_billing_customer_service(
    db_session: NamedDependency[AsyncSession],
) -> BillingCustomerService:
    return BillingCustomerService(db_session)
