"""The control-plane services outside a request: for the console (`hydrant tenants …`,
`hydrant batches …`, `hydrant billing …`, `hydrant projects …`, `hydrant credits …`).

Same services as the admin API, made by the same providers (`*/deps.py`), on
one session of the configured database (one unit of work: committed when the
block succeeds), acting as the console principal. Why not copies of the
service logic: a rule changed in a service must hold at the console too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from hydrant.platform.adapters.deps import provide_adapter_service
from hydrant.platform.adapters.service import AdapterService
from hydrant.platform.auth.from_settings import build_authenticator
from hydrant.platform.auth.principal import CONSOLE, Principal
from hydrant.platform.batches.book import BatchBook
from hydrant.platform.credits.deps import provide_credit_service
from hydrant.platform.credits.service import CreditService
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.deps import provide_invoice_service
from hydrant.platform.invoices.service import InvoiceService
from hydrant.platform.keys.deps import provide_key_service
from hydrant.platform.keys.service import KeyService
from hydrant.platform.prices.deps import provide_price_service
from hydrant.platform.prices.service import PriceService
from hydrant.platform.projects.deps import provide_project_service
from hydrant.platform.projects.service import ProjectService
from hydrant.platform.tenants.deps import provide_plan_service, provide_tenant_service
from hydrant.platform.tenants.plan_service import PlanService
from hydrant.platform.tenants.service import TenantService
from hydrant.platform.usage_export.deps import provide_billing_customer_service
from hydrant.platform.usage_export.service import BillingCustomerService
from hydrant.settings import Settings


@dataclass
class AdminServices:
    principal: Principal
    # For work in short units of its own beside the command's one (a long export that
    # reads a day per transaction), not for queries of the command's unit of work.
    database: Database
    tenants: TenantService
    plans: PlanService
    keys: KeyService
    prices: PriceService
    batches: BatchBook
    credits: CreditService
    adapters: AdapterService
    invoices: InvoiceService
    projects: ProjectService
    billing_customers: BillingCustomerService


@asynccontextmanager
async def admin_services(settings: Settings) -> AsyncIterator[AdminServices]:
    database = Database(settings.effective_database_url)
    # This process's own authenticator: its cache is empty and dies with the command;
    # a gateway's cache drops a changed key or tenant within its TTL.
    authenticator = build_authenticator(settings, database, store_bootstrap_key=None)
    try:
        async with database.session() as session:
            yield AdminServices(
                principal=CONSOLE,
                database=database,
                tenants=await provide_tenant_service(session, authenticator),
                plans=await provide_plan_service(session, authenticator),
                keys=await provide_key_service(session, authenticator, settings),
                prices=await provide_price_service(session, authenticator),
                # Its own short units of work: a cancel is seen by the batch's runner at once.
                batches=BatchBook(database, tenant_only=False),
                credits=await provide_credit_service(session, database),
                # No catalog here: gateways see the change within HYDRANT_ADAPTER_REFRESH_S.
                adapters=await provide_adapter_service(session, authenticator, None),
                invoices=await provide_invoice_service(session, database, settings),
                projects=await provide_project_service(session, authenticator),
                billing_customers=await provide_billing_customer_service(session),
            )
    finally:
        await database.dispose()
