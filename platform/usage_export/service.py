"""The rules of a tenant's Stripe customer (`payload.stripe_customer_id` of its meter events).

One service for the admin API (`/admin/tenants/{id}/billing-customer`) and the console
(`hydrant billing customer`), scoped through the principal like every tenant lookup.
"""

from __future__ import annotations

import re

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.models import BillingCustomer
from hydrant.platform.errors import InvalidRequest, NotFound
from hydrant.platform.tenants.repository import get_tenant

# Stripe's customer ids: `cus_` and letters and digits (test and live mode alike).
CUSTOMER_ID = re.compile(r"cus_[A-Za-z0-9]{1,96}")


class BillingCustomerService:
    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def get(self, principal: Principal, tenant_id: str) -> str | None:
        await self._tenant(principal, tenant_id)
        row = await self._session.get(BillingCustomer, tenant_id)
        return None if row is None else row.stripe_customer_id

    async def set(self, principal: Principal, tenant_id: str, customer: str | None) -> str | None:
        """Set (or, with None, clear) the customer; records that waited for it then go."""
        await self._tenant(principal, tenant_id)
        if customer is not None and not CUSTOMER_ID.fullmatch(customer):
            raise InvalidRequest(
                "a Stripe customer id looks like cus_ followed by letters and digits",
                param="stripe_customer_id",
            )
        row = await self._session.get(BillingCustomer, tenant_id)
        if customer is None:
            if row is not None:
                await self._session.delete(row)
        elif row is None:
            self._session.add(BillingCustomer(tenant_id=tenant_id, stripe_customer_id=customer))
        else:
            row.stripe_customer_id = customer
        await self._session.flush()
        return customer

    async def _tenant(self, principal: Principal, tenant_id: str) -> None:
        if await get_tenant(self._session, principal, tenant_id) is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
