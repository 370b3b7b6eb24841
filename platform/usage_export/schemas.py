"""The billing customer's body and answer on `/admin/tenants/{id}/billing-customer`."""

from __future__ import annotations

import msgspec


class BillingCustomerUpdate(msgspec.Struct, forbid_unknown_fields=True):
    stripe_customer_id: str | None  # null clears it


class BillingCustomerView(msgspec.Struct):
    tenant_id: str
    stripe_customer_id: str | None
