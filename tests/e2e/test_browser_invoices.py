"""Invoices in a real headless Chromium against a real `hydrant serve`.

A tenant with a credit sends real `/v1` traffic this month; last month it used two
models (written straight into the server's ledger), the admin API finalizes last month,
and one more entry of last month lands after that. Signed in with its own key, the
tenant opens its invoices: last month's finalized invoice (two models), this month's
draft (the real traffic, the credit applied, and last month's late entry as an
adjustment line), and downloads the draft's PDF from the page's link, whose text holds
the same lines and totals as the page. Screenshots go to `test-artifacts/`.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from hydrant_server import RunningServer
from pypdf import PdfReader
from sqlalchemy import select
from test_browser_admin import (
    ARTIFACTS,
    TIMEOUT_MS,
    _chat,
    _check_accessible_and_narrow,
    _sign_in,
)
from test_browser_admin import browser as browser  # the shared Chromium fixture

from hydrant.platform.db.models import LedgerEntry, ModelDeployment, Price
from hydrant.platform.db.session import Database
from hydrant.platform.invoices.periods import Month

pytestmark = [pytest.mark.slow, pytest.mark.integration]

UTC_ZONE = ZoneInfo("UTC")


async def _write_last_month(data_dir: Path, tenant_id: str, month: Month, *, late: bool) -> None:
    """Last month's entries of `demo` and a second model, as the gateway's ledger writes
    them (at the price in force), into the server's own SQLite database."""
    db = Database(f"sqlite+aiosqlite:///{data_dir / 'hydrant.db'}")
    start, _ = month.window(UTC_ZONE)
    try:
        async with db.session() as session:
            demo = await session.scalar(
                select(ModelDeployment).where(ModelDeployment.name == "demo")
            )
            other = await session.scalar(
                select(ModelDeployment).where(ModelDeployment.name == "other-model")
            )
            if other is None:
                other = ModelDeployment(name="other-model", path="/models/other")
                session.add(other)
                await session.flush()
                session.add(
                    Price(
                        model_id=other.id,
                        effective_from=start - timedelta(days=60),
                        input_per_mtok=Decimal("2"),
                        cached_input_per_mtok=Decimal("1"),
                        output_per_mtok=Decimal("8"),
                    )
                )
            assert demo is not None
            entries = (
                [(other, 6, "late-1", Decimal("0.018"))]
                if late
                else [
                    (demo, 2, "last-1", Decimal("0.0009")),
                    (other, 9, "last-2", Decimal("0.018")),
                ]
            )
            await session.flush()
            for model, day, request_id, charged in entries:
                finished = start + timedelta(days=day, hours=10)
                price_id = await session.scalar(
                    select(Price.id)
                    .where(Price.model_id == model.id, Price.effective_from <= finished)
                    .order_by(Price.effective_from.desc())
                    .limit(1)
                )
                session.add(
                    LedgerEntry(
                        request_id=f"{request_id}-{tenant_id}",
                        tenant_id=tenant_id,
                        model_id=model.id,
                        price_id=price_id,
                        status="finished",
                        input_tokens=1000,
                        cached_tokens=0,
                        output_tokens=2000,
                        charged=charged,
                        started_at=finished - timedelta(seconds=1),
                        finished_at=finished,
                    )
                )
    finally:
        await db.dispose()


def _pdf_picture(pdf: bytes, target: Path) -> Any:
    """The PDF's first page as a PNG (pdfium, the renderer Chromium uses), to look at."""
    import pypdfium2

    document = pypdfium2.PdfDocument(pdf)
    try:
        image = document[0].render(scale=1.5).to_pil().convert("L")
    finally:
        document.close()
    image.save(target)
    return image


def _write(data_dir: Path, tenant_id: str, month: Month, *, late: bool) -> None:
    """On a thread of its own: Playwright's sync API keeps an event loop on this one."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(_write_last_month(data_dir, tenant_id, month, late=late))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def test_invoice_pages_and_pdf(server: RunningServer, browser: Any) -> None:
    tenant_id, key = server.tenant_key("acme-invoices")
    this_month = Month.of(datetime.now(UTC), UTC_ZONE)
    last_month = this_month.previous()
    with server.admin() as admin:
        granted = admin.post(
            f"/admin/tenants/{tenant_id}/credits", json={"kind": "promo", "amount": "0.000002"}
        )
        assert granted.status_code == 201, granted.text
    _write(server.data_dir, tenant_id, last_month, late=False)
    _chat(server, key, 2)
    with server.admin() as admin:
        done = admin.post(f"/admin/invoices/finalize?month={last_month.label}")
        assert done.status_code == 200, done.text
        # the server's hourly finalize job also runs once 5 s after it starts: on a slow
        # machine that first run may land after the writes above and finalize the month
        # itself, and this call then finds the invoice it made (the same function)
        report = done.json()
        assert len(report["created"]) + len(report["existing"]) == 1, done.text
        assert report["failed"] == [] and report["still_open"] == 0, done.text
    _write(server.data_dir, tenant_id, last_month, late=True)
    with server.admin() as admin:  # the draft, as the API shows it (the two chats recorded)
        for _ in range(50):
            draft = admin.get(f"/admin/tenants/{tenant_id}/invoices/{this_month.label}").json()
            if sum(line["requests"] for line in draft["lines"]) >= 3:
                break
            time.sleep(0.2)
    assert [line["kind"] for line in draft["lines"]] == ["usage", "adjustment"]
    assert Decimal(draft["credits_applied"]) == Decimal("0.000002")

    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        _sign_in(page, server.base_url, key)
        page.get_by_role("link", name="Invoices").click()
        page.wait_for_load_state()  # a click waits for the commit only: rows may still be parsing
        assert page.get_by_role("heading", level=1).inner_text() == "Invoices of acme-invoices"
        rows = page.locator("#invoices-table tbody tr")
        assert rows.count() == 2
        page.get_by_role("link", name="HYD-", exact=False).click()
        page.wait_for_load_state()
        assert page.locator("#invoice-status").inner_text() == "finalized"
        finalized = page.locator('#invoice-lines tbody tr[data-kind="usage"]').all_inner_texts()
        assert len(finalized) == 2 and any("other-model" in r for r in finalized)
        assert page.locator('[data-total="amount_due"]').inner_text() == "0.02 USD"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "invoice-finalized.png"), full_page=True)

        page.goto(f"{server.base_url}/ui/tenants/{tenant_id}/invoices/{this_month.label}")
        assert page.locator("#invoice-status").inner_text() == "draft"
        adjustment = page.locator('#invoice-lines tr[data-kind="adjustment"]').inner_text()
        assert f"Adjustment for {last_month.label}: other-model" in adjustment
        amounts = page.locator('#invoice-lines td[data-col="amount"]').all_inner_texts()
        assert amounts == [line["amount"] for line in draft["lines"]]
        due = page.locator('[data-total="amount_due"]').inner_text()
        assert due == f"{draft['amount_due']} USD"
        page.screenshot(path=str(ARTIFACTS / "invoice-draft.png"), full_page=True)

        with page.expect_download() as download_info:
            page.locator("#pdf-link").click()
        pdf = Path(download_info.value.path()).read_bytes()
        assert pdf.startswith(b"%PDF")
        text = "".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf)).pages)
        for needle in (*amounts, draft["credits_applied"], f"Amount due: {due}"):
            assert needle in text, needle
        assert f"Adjustment for {last_month.label}" in text
        picture = _pdf_picture(pdf, ARTIFACTS / "invoice-draft-pdf.png")
        assert picture.getextrema()[0] < 64  # dark ink on the page: it drew something

        # The tenant's credits: the grant fully spent by this month's draft, no forms.
        page.get_by_role("link", name="Credits").click()
        page.wait_for_load_state()
        assert page.locator("#credit-balance").get_attribute("data-value") == "0.000000"
        assert page.locator('#grants-table td[data-col="used"]').inner_text() == "0.000002"
        assert page.get_by_role("button", name="Grant").count() == 0

        page.set_viewport_size({"width": 390, "height": 844})
        for path in (
            f"/ui/tenants/{tenant_id}/invoices",
            f"/ui/tenants/{tenant_id}/invoices/{this_month.label}",
            f"/ui/tenants/{tenant_id}/credits",
        ):
            page.goto(f"{server.base_url}{path}")
            _check_accessible_and_narrow(page, path)
        page.goto(f"{server.base_url}/ui/tenants/{tenant_id}/invoices/{this_month.label}")
        page.screenshot(path=str(ARTIFACTS / "invoice-draft-phone.png"), full_page=True)
        print(f"screenshots: {ARTIFACTS}/invoice-finalized.png, invoice-draft.png")
    finally:
        context.close()


def test_admins_grant_and_void_credit_on_the_page(server: RunningServer, browser: Any) -> None:
    """The admin's credits page: a grant made with the form counts in the tenant's balance
    (read back with the tenant's own key), and a void takes what is left of it away."""
    tenant_id, key = server.tenant_key("acme-credits")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        _sign_in(page, server.base_url, server.admin_key)
        page.goto(f"{server.base_url}/ui/tenants/{tenant_id}")
        page.get_by_role("link", name="Credits").click()
        page.wait_for_load_state()
        assert page.get_by_role("heading", level=1).inner_text() == "Credits of acme-credits"
        page.get_by_label("Kind").select_option("promo")
        page.get_by_label("Amount").fill("12.50")
        page.get_by_label("Note").fill("launch offer")
        page.get_by_role("button", name="Grant", exact=True).click()
        page.wait_for_load_state()
        assert "Credit granted" in page.locator("p.notice").inner_text()
        assert page.locator("#credit-balance").get_attribute("data-value") == "12.500000"
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            own = client.get("/account/balance", headers={"authorization": f"Bearer {key}"})
        assert own.json()["available"] == "12.500000"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "credits-admin.png"), full_page=True)

        page.get_by_role("button", name="Void").click()
        page.wait_for_load_state()
        assert page.locator("#credit-balance").get_attribute("data-value") == "0.000000"
        assert page.locator('#grants-table [data-col="status"]').inner_text() == "voided"
        page.set_viewport_size({"width": 390, "height": 844})
        _check_accessible_and_narrow(page, f"/ui/tenants/{tenant_id}/credits")
    finally:
        context.close()
