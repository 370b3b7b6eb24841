"""Routes: `/account/invoices` (a tenant's own, with its inference key),
`/admin/tenants/{id}/invoices` and `POST /admin/invoices/finalize`.

`/…/invoices/{ref}` takes an invoice id (`inv_…`) or a month (`2026-12`: its finalized
invoice, else its draft), with `.csv`, `.pdf` or `.html` for a download instead of JSON.
"""

from __future__ import annotations

import asyncio
from typing import Any

from litestar import Controller, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
    require_inference,
)
from hydrant.platform.auth.principal import Principal
from hydrant.platform.invoices.deps import provide_invoice_service
from hydrant.platform.invoices.periods import Month
from hydrant.platform.invoices.render import (
    CSV_MEDIA_TYPE,
    PDF_MEDIA_TYPE,
    download_name,
    invoice_csv,
    invoice_html,
    invoice_pdf,
)
from hydrant.platform.invoices.schemas import FinalizeView, InvoiceList, InvoiceView
from hydrant.platform.invoices.service import InvoiceService
from hydrant.platform.invoices.statement import InvoiceDoc

DOWNLOADS = ("csv", "pdf", "html")


def split_ref(ref: str) -> tuple[str, str | None]:
    """`inv_x.pdf` -> (`inv_x`, `pdf`); a ref with no known suffix is JSON."""
    name, dot, extension = ref.rpartition(".")
    if dot and extension in DOWNLOADS:
        return name, extension
    return ref, None


async def respond(doc: InvoiceDoc, extension: str | None) -> Response[Any]:
    """The invoice in the asked format; the PDF is drawn off the event loop (embedding its
    font takes a CPU-bound tenth of a second or more)."""
    if extension is None:
        return Response(InvoiceView.of(doc))
    disposition = "inline" if extension == "html" else "attachment"
    headers = {"content-disposition": f'{disposition}; filename="{download_name(doc, extension)}"'}
    if extension == "csv":
        return Response(invoice_csv(doc), media_type=CSV_MEDIA_TYPE, headers=headers)
    if extension == "pdf":
        pdf = await asyncio.to_thread(invoice_pdf, doc)
        return Response(pdf, media_type=PDF_MEDIA_TYPE, headers=headers)
    return Response(invoice_html(doc), media_type="text/html", headers=headers)


class AccountInvoicesController(Controller):
    """A tenant reading its own invoices with one of its inference keys."""

    path = "/account/invoices"
    guards = [require_inference]
    # `principal` is the app-wide provider: the inference principal (see app.py).
    dependencies = {"invoice_service": Provide(provide_invoice_service)}

    @get("/")
    async def list_own_invoices(
        self,
        principal: NamedDependency[Principal],
        invoice_service: NamedDependency[InvoiceService],
    ) -> InvoiceList:
        docs = await invoice_service.list(principal, principal.tenant_id or "")
        return InvoiceList(data=[InvoiceView.of(d) for d in docs])

    @get("/{ref:str}")
    async def get_own_invoice(
        self,
        ref: FromPath[str],
        principal: NamedDependency[Principal],
        invoice_service: NamedDependency[InvoiceService],
    ) -> Response[Any]:
        name, extension = split_ref(ref)
        return await respond(
            await invoice_service.get(principal, principal.tenant_id or "", name), extension
        )


class InvoiceAdminController(Controller):
    path = "/admin/tenants/{tenant_id:str}/invoices"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "invoice_service": Provide(provide_invoice_service),
    }

    @get("/")
    async def list_invoices(
        self,
        tenant_id: FromPath[str],
        principal: NamedDependency[Principal],
        invoice_service: NamedDependency[InvoiceService],
    ) -> InvoiceList:
        docs = await invoice_service.list(principal, tenant_id)
        return InvoiceList(data=[InvoiceView.of(d) for d in docs])

    @get("/{ref:str}")
    async def get_invoice(
        self,
        tenant_id: FromPath[str],
        ref: FromPath[str],
        principal: NamedDependency[Principal],
        invoice_service: NamedDependency[InvoiceService],
    ) -> Response[Any]:
        name, extension = split_ref(ref)
        return await respond(await invoice_service.get(principal, tenant_id, name), extension)


class InvoiceFinalizeController(Controller):
    """Finalizes a closed month for every tenant whose month has ended in its own zone;
    idempotent. The mails are claimed here and sent by the invoices job's next run."""

    path = "/admin/invoices"
    guards = [require_admin]
    dependencies = {"invoice_service": Provide(provide_invoice_service)}

    @post("/finalize", status_code=200)
    async def finalize_invoices(
        self,
        invoice_service: NamedDependency[InvoiceService],
        month: FromQuery[str | None] = None,
    ) -> FinalizeView:
        target = Month.parse(month) if month is not None else None
        return FinalizeView.of(month, await invoice_service.finalize(target))
