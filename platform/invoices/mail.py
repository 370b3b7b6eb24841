"""Mailing a finalized invoice to the tenant's billing contacts: the digests' recipients
(or its contact address), less those who unsubscribed, through the alerts' mail path
(digests/alert_mail.py), with the PDF attached.

Once per invoice: finalization claims an `InvoiceSend` (unique per invoice) in the same
transaction as the invoice, a mailing job moves it `pending` -> `sending` -> `sent`, so
a job delivered twice mails once; a refused mail goes back to `pending` and the
invoices job re-sends it.
"""

from __future__ import annotations

import asyncio
import logging

from hydrant.platform.db.models import Invoice, InvoiceSend
from hydrant.platform.digests.alert_mail import deliver, take
from hydrant.platform.digests.service import DigestService, public_url
from hydrant.platform.invoices import repository as repo
from hydrant.platform.invoices.render import download_name, invoice_pdf
from hydrant.platform.invoices.schemas import InvoiceView
from hydrant.platform.invoices.service import doc_of

log = logging.getLogger(__name__)


class InvoiceMail:
    def __init__(self, digests: DigestService) -> None:
        self.digests = digests

    async def send(self, send_id: str) -> bool:
        """Mail one claimed invoice; False when another run has it or it was sent."""
        taken = await take(self.digests, InvoiceSend, send_id)
        if taken is None:
            return False
        claim, tenant, recipients = taken
        async with self.digests.database.session() as session:
            invoice = await session.get(Invoice, claim.invoice_id)
            assert invoice is not None
            lines = await repo.lines_of(session, invoice.id)
        settings = self.digests.settings
        doc = doc_of(invoice, lines, tenant, settings.invoice_issuer_name)
        view = InvoiceView.of(doc)
        pdf = await asyncio.to_thread(invoice_pdf, doc)  # CPU-bound: off the event loop
        await deliver(
            self.digests,
            InvoiceSend,
            send_id,
            tenant,
            recipients,
            template="invoice",
            subject=f"{settings.invoice_issuer_name} invoice {doc.number} for {doc.period}:"
            f" {view.amount_due} {doc.currency} due",
            message_key=f"invoice|{invoice.id}",
            attachments=[(download_name(doc, "pdf"), "pdf", pdf)],
            invoice=view,
            invoice_url=f"{public_url(settings)}/ui/tenants/{tenant.id}/invoices/{invoice.id}",
        )
        log.info("invoice mailed", extra={"tenant_id": tenant.id, "number": doc.number})
        return True
