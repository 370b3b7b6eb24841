"""Which Stripe customer a tenant's usage is reported for (`payload.stripe_customer_id`)."""

from __future__ import annotations

import re

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import BillingCustomer
from hydrant.platform.errors import InvalidRequest

# Stripe's customer ids: `cus_` and letters and digits (test and live alike).
CUSTOMER_ID = re.compile(r"cus_[A-Za-z0-9]{1,96}")


async def stripe_customer(session: AsyncSession, tenant_id: str) -> str | None:
    return await session.scalar(
        select(BillingCustomer.stripe_customer_id).where(BillingCustomer.tenant_id == tenant_id)
    )


async def set_stripe_customer(session: AsyncSession, tenant_id: str, customer: str | None) -> None:
    """Set (or, with None, clear) the tenant's customer; records waiting for it then go."""
    if customer is None:
        await session.execute(delete(BillingCustomer).where(BillingCustomer.tenant_id == tenant_id))
        return
    if not CUSTOMER_ID.fullmatch(customer):
        raise InvalidRequest(
            "a Stripe customer id looks like cus_ followed by letters and digits",
            param="stripe_customer_id",
        )
    row = await session.get(BillingCustomer, tenant_id)
    if row is None:
        session.add(BillingCustomer(tenant_id=tenant_id, stripe_customer_id=customer))
    else:
        row.stripe_customer_id = customer
