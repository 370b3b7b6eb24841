"""A tenant's Batch API batches: status, lines, what they were charged, their files.

The same `BatchBook` as the console's: a tenant signed in sees its own batches (another
tenant's page is a 404, through `TenantService.get` as on the usage page), an admin any
tenant's. What a batch was charged is read from the ledger, like every report.
"""

from __future__ import annotations

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery

from hydrant.platform.batches.book import BatchBook
from hydrant.platform.batches.deps import provide_batch_book
from hydrant.platform.tenants.controllers import provide_tenant_service
from hydrant.platform.tenants.service import TenantService
from hydrant.web.context import Page


class BatchPagesController(Controller):
    path = "/tenants"
    dependencies = {
        "book": Provide(provide_batch_book),
        "tenants": Provide(provide_tenant_service),
    }

    @get("/{tenant_id:str}/batches")
    async def batches(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        book: NamedDependency[BatchBook],
        tenants: NamedDependency[TenantService],
        after: FromQuery[str | None] = None,
    ) -> Response[str]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)  # another tenant's id: 404
        rows, more = await book.page(principal, tenant_id=tenant.id, limit=50, after=after)
        charged = await book.charged(rows)
        return page.render(
            "batches.html",
            tenant=tenant,
            batches=rows,
            charged=charged,
            next_after=rows[-1].id if more and rows else None,
        )
