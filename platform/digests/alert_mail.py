"""The mail path every alert shares (budget alerts, low-balance alerts), and invoices.

A claimed alert row moves `pending` -> `sending` with a conditional UPDATE, so a job
delivered twice mails once; a failed send puts it back to `pending`, and the periodic
check re-enqueues pending rows older than `RESEND_AFTER` (a lost enqueue is retried,
never dropped). Kept in one place so both kinds keep the same guarantees.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.credit_models import CreditAlertSend
from hydrant.platform.db.invoice_models import InvoiceSend
from hydrant.platform.db.models import BudgetAlertSend, Tenant
from hydrant.platform.digests.render import build_message, render
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.mail.mailer import MailError

RESEND_AFTER = timedelta(minutes=1)

Row = TypeVar("Row", BudgetAlertSend, CreditAlertSend, InvoiceSend)
# (file name, MIME subtype of application/*, content): e.g. an invoice's PDF
Attachment = tuple[str, str, bytes]


async def requeue_stale(
    session: AsyncSession,
    model: type[Row],
    enqueue: Enqueue,
    job: str,
    now: datetime,
    *,
    argument: str = "alert_id",
) -> None:
    """Enqueue again (after commit) every row still pending a minute after its claim; the
    job gets the row's id as `argument`."""
    stale = await session.scalars(
        select(model.id).where(model.status == "pending", model.claimed_at < now - RESEND_AFTER)
    )
    for row_id in stale.all():
        enqueue_after_commit(session, enqueue, job, **{argument: row_id})


async def take(
    digests: DigestService, model: type[Row], alert_id: str
) -> tuple[Row, Tenant, list[str]] | None:
    """Move a pending row to `sending`: the row, its tenant and the recipients, or None
    when another run has it or it was sent already."""
    async with digests.database.session() as session:
        taken = await session.execute(
            update(model)
            .where(model.id == alert_id, model.status == "pending")
            .values(status="sending")
        )
        if taken.rowcount != 1:  # type: ignore[attr-defined]
            return None
        alert = await session.get(model, alert_id)
        assert alert is not None
        tenant = await session.get(Tenant, alert.tenant_id)
        assert tenant is not None
        return alert, tenant, list(await digests.recipients_for(session, tenant))


async def deliver(
    digests: DigestService,
    model: type[Row],
    alert_id: str,
    tenant: Tenant,
    recipients: list[str],
    *,
    template: str,
    subject: str,
    message_key: str,
    attachments: Sequence[Attachment] = (),
    **context: Any,
) -> None:
    """Mail a taken row to each recipient, then mark it `sent`; on a mail error it goes
    back to `pending` (the check retries it) and the error propagates."""
    try:
        for recipient in recipients:
            url = digests.unsubscribe_url(tenant.id, recipient)
            rendered = render(
                template, subject, None, tenant_name=tenant.name, unsubscribe_url=url, **context
            )
            message = build_message(
                rendered,
                sender=digests.settings.digest_from,
                recipient=recipient,
                message_key=message_key,
                unsubscribe_url=url,
            )
            for filename, subtype, content in attachments:
                message.add_attachment(
                    content, maintype="application", subtype=subtype, filename=filename
                )
            await digests.mailer.send(message)
    except MailError:
        async with digests.database.session() as session:
            await session.execute(
                update(model).where(model.id == alert_id).values(status="pending")
            )
        raise
    async with digests.database.session() as session:
        await session.execute(
            update(model).where(model.id == alert_id).values(status="sent", sent_at=utcnow())
        )
