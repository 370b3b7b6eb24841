"""A tenant's invoices: the open month's draft and its finalized invoices, each with its
lines and totals, and its PDF, CSV and HTML downloads.

The same `InvoiceService` as `/account/invoices`: a tenant signed in sees its own (another
tenant's page is a 404, as on the usage page), an admin any tenant's. The downloads are
the API's own renderings (`invoices.controllers.respond`), under the page's session.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath

from hydrant.platform.invoices.controllers import respond, split_ref
from hydrant.platform.invoices.deps import provide_invoice_service
from hydrant.platform.invoices.render import invoice_table
from hydrant.platform.invoices.schemas import InvoiceView
from hydrant.platform.invoices.service import InvoiceService
from hydrant.platform.tenants.controllers import provide_tenant_service
from hydrant.platform.tenants.service import TenantService
from hydrant.web.context import Page


class InvoicePagesController(Controller):
    path = "/tenants"
    dependencies = {
        "invoice_service": Provide(provide_invoice_service),
        "tenants": Provide(provide_tenant_service),
    }

    @get("/{tenant_id:str}/invoices")
    async def invoices(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        invoice_service: NamedDependency[InvoiceService],
        tenants: NamedDependency[TenantService],
    ) -> Response[str]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)  # another tenant's id: 404
        docs = await invoice_service.list(principal, tenant.id)
        return page.render(
            "invoices.html", tenant=tenant, invoices=[InvoiceView.of(d) for d in docs]
        )

    @get("/{tenant_id:str}/invoices/{ref:str}")
    async def invoice(
        self,
        tenant_id: FromPath[str],
        ref: FromPath[str],
        page: NamedDependency[Page],
        invoice_service: NamedDependency[InvoiceService],
        tenants: NamedDependency[TenantService],
    ) -> Response[Any]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)
        name, extension = split_ref(ref)
        doc = await invoice_service.get(principal, tenant.id, name)
        if extension is not None:
            return page.respond(await respond(doc, extension))
        return page.render(
            "invoice.html",
            tenant=tenant,
            doc=doc,
            invoice=InvoiceView.of(doc),
            lines_table=invoice_table(doc),
        )
