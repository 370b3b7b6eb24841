"""Routes: `/admin/tenants/{id}/billing-customer`, the Stripe customer the usage export
reports a tenant's usage for."""

from __future__ import annotations

from litestar import Controller, get, put
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, JSONBody

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.auth.principal import Principal
from hydrant.platform.usage_export.deps import provide_billing_customer_service
from hydrant.platform.usage_export.schemas import BillingCustomerUpdate, BillingCustomerView
from hydrant.platform.usage_export.service import BillingCustomerService


class BillingCustomerController(Controller):
    path = "/admin/tenants/{tenant_id:str}/billing-customer"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "customers": Provide(provide_billing_customer_service),
    }

    @get("/")
    async def get_billing_customer(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        customers: NamedDependency[BillingCustomerService],
    ) -> BillingCustomerView:
        return BillingCustomerView(tenant_id, await customers.get(principal, tenant_id))

    @put("/")
    async def set_billing_customer(
        self,
        tenant_id: FromPath[str],
        data: JSONBody[BillingCustomerUpdate],
        principal: NamedDependency[Principal],
        customers: NamedDependency[BillingCustomerService],
    ) -> BillingCustomerView:
        customer = await customers.set(principal, tenant_id, data.stripe_customer_id)
        return BillingCustomerView(tenant_id, customer)
