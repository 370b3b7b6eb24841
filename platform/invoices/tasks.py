"""Thin job wrappers: finalize the month that closed (hourly), and mail one invoice."""

from __future__ import annotations

import logging
from typing import Any

from hydrant.platform.db.models import InvoiceSend
from hydrant.platform.digests.alert_mail import requeue_stale
from hydrant.platform.digests.deps import digest_service
from hydrant.platform.invoices.mail import InvoiceMail
from hydrant.platform.invoices.periods import Month
from hydrant.platform.invoices.service import SEND_JOB, finalize_month
from hydrant.platform.jobs.context import Job, JobContext

log = logging.getLogger(__name__)

FINALIZE_JOB = "hydrant.invoices.finalize"
PROGRESS_EVERY = 100  # tenants between two progress lines


async def finalize_invoices(ctx: JobContext, month: str | None = None) -> dict[str, Any]:
    """Each tenant's previous local month (or `month`), once it has closed in its zone;
    then re-sends the invoice mails still pending (claimed by the API or the console,
    or refused by the mail server)."""

    def progress(done: int, total: int) -> None:
        if done % PROGRESS_EVERY == 0 or done == total:
            log.info("finalizing invoices", extra={"done": done, "tenants": total})

    report = await finalize_month(
        ctx.database,
        ctx.settings,
        Month.parse(month) if month else None,
        now=ctx.clock(),
        enqueue=ctx.enqueue,
        progress=progress,
    )
    async with ctx.database.session() as session:
        await requeue_stale(
            session, InvoiceSend, ctx.enqueue, SEND_JOB, ctx.clock(), argument="send_id"
        )
    return {
        "created": len(report.created),
        "existing": len(report.existing),
        "empty": report.empty,
        "still_open": report.still_open,
        "failed": len(report.failed),
    }


async def send_invoice(ctx: JobContext, send_id: str) -> dict[str, Any]:
    return {"sent": await InvoiceMail(digest_service(ctx)).send(send_id)}


TASKS = (Job(FINALIZE_JOB, finalize_invoices), Job(SEND_JOB, send_invoice))
