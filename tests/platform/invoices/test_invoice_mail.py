"""Invoice mail through a real SMTP server (STARTTLS, AUTH), on SQLite and PostgreSQL: the
hourly job finalizes the closed month and mails each billing contact once, PDF attached;
unsubscribed contacts get nothing; a refused mail is re-sent by the next run; a job
delivered twice, and a second finalization, mail nothing more."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

from digest_factories import make_ledger, make_world, record
from invoice_factories import local
from pypdf import PdfReader
from smtp_inbox import SmtpServer
from sqlalchemy import select

from hydrant.platform.db.models import InvoiceSend
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.invoices.periods import Month
from hydrant.platform.invoices.service import finalize_tenant
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.settings import load_settings

FINALIZE = "hydrant.invoices.finalize"
SEND = "hydrant.invoices.send"
JUST_AFTER = datetime(2026, 12, 1, 5, 30, tzinfo=UTC)  # 00:30 Dec 1 in New York


async def test_the_job_mails_each_invoice_once_with_its_pdf(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db, recipients=["billing@acme.test", "cfo@acme.test"])
    async with db.session() as session:
        await repository.add_unsubscribe(session, world.tenant_id, "cfo@acme.test")
    await make_world(db, name="idle", recipients=["idle@idle.test"])  # nothing to bill
    ledger = make_ledger(db, data_dir)
    for day in (4, 18):
        await record(
            ledger, world, key="backend", model="llama-small",
            finished_at=local(2026, 11, day, 10), tokens=(4000, 1000, 800),
        )  # fmt: skip
    clock = [datetime(2026, 12, 1, 4, 30, tzinfo=UTC)]  # 23:30 Nov 30 in New York
    settings = load_settings({}, data_dir=data_dir, smtp_url=smtp.url(), secret_key="s" * 40)
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: clock[0], periodic=())

    first = await jobs.run(FINALIZE)
    await jobs.idle()
    assert first["created"] == 0  # not yet midnight there: its last month is October
    assert smtp.inbox.count() == 0

    smtp.inbox.refuse_next = 5  # the mail server refuses the first attempt
    clock[0] = JUST_AFTER
    made = await jobs.run(FINALIZE)
    await jobs.idle()
    assert made["created"] == 1 and made["empty"] == 1
    assert smtp.inbox.count() == 0
    async with db.session() as session:
        [claim] = list(await session.scalars(select(InvoiceSend)))
    assert claim.status == "pending"

    smtp.inbox.refuse_next = 0
    clock[0] = JUST_AFTER + timedelta(hours=1)  # the next hourly run re-sends it
    again = await jobs.run(FINALIZE)
    await jobs.idle()
    assert again["created"] == 0 and again["existing"] == 1
    [mail] = smtp.inbox.to("billing@acme.test")
    assert smtp.inbox.to("cfo@acme.test") == [] and smtp.inbox.count() == 1
    assert "HYD-2026-000001" in mail["Subject"] and "2026-11" in mail["Subject"]
    assert mail["List-Unsubscribe"]
    body = str(mail.get_body(("plain",)).get_content())  # type: ignore[union-attr]
    assert "Amount due:" in body and "Unsubscribe: " in body
    [pdf] = [
        part for part in mail.iter_attachments() if part.get_content_type() == "application/pdf"
    ]
    assert pdf.get_filename() == "HYD-2026-000001.pdf"
    text = PdfReader(io.BytesIO(pdf.get_content())).pages[0].extract_text()
    assert "HYD-2026-000001" in text and "Amount due" in text

    assert await jobs.run(SEND, {"send_id": claim.id}) == {"sent": False}
    await jobs.run(FINALIZE)
    await jobs.idle()
    assert smtp.inbox.count() == 1


async def test_concurrent_mailing_jobs_mail_an_invoice_once(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db, recipients=["billing@acme.test"])
    ledger = make_ledger(db, data_dir)
    await record(
        ledger, world, key="backend", model="qwen-tiny",
        finished_at=local(2026, 11, 7, 10), tokens=(100, 0, 100),
    )  # fmt: skip
    settings = load_settings({}, data_dir=data_dir, smtp_url=smtp.url(), secret_key="s" * 40)
    # Finalized by the console: claimed, nothing enqueued
    made = await finalize_tenant(db, settings, world.tenant_id, Month(2026, 11), now=JUST_AFTER)
    async with db.session() as session:
        [claim] = list(await session.scalars(select(InvoiceSend)))
    assert claim.invoice_id == made.invoice_id and claim.status == "pending"
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: JUST_AFTER, periodic=())
    results = await asyncio.gather(*(jobs.run(SEND, {"send_id": claim.id}) for _ in range(4)))
    assert sorted(r["sent"] for r in results) == [False, False, False, True]
    assert smtp.inbox.count() == 1
