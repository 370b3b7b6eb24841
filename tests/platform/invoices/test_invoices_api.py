"""The invoices API on the real app, SQLite and PostgreSQL: the three cases on every route
(anonymous 401, another tenant's 404, the owner 200), finalization over the API
idempotent, and the JSON, CSV, HTML and PDF of one invoice agreeing line by line."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from pathlib import Path

from control_plane_helpers import ControlPlane, bearer, control_plane
from digest_factories import make_ledger, make_world, record
from invoice_factories import add_grant, local
from pypdf import PdfReader

from hydrant.platform.db.session import Database


async def _setup(db: Database, data_dir: Path) -> tuple[str, str]:
    """Tenant `acme` with November usage of two models and a credit; `other` with none."""
    acme = await make_world(db, name="acme")
    other = await make_world(db, name="other")
    await add_grant(db, acme.tenant_id, "0.10", local(2026, 10, 1, 0))
    ledger = make_ledger(db, data_dir)
    for day, model, key in ((2, "llama-small", "backend"), (9, "qwen-tiny", "batch"),
                            (20, "llama-small", "backend")):  # fmt: skip
        await record(
            ledger, acme, key=key, model=model, finished_at=local(2026, 11, day, 9),
            tokens=(12_000, 2_000, 3_000),
        )  # fmt: skip
    return acme.tenant_id, other.tenant_id


async def test_three_cases_finalize_and_four_formats_agree(
    database_url: str, db: Database, data_dir: Path
) -> None:
    acme_id, other_id = await _setup(db, data_dir)
    async with control_plane(database_url, data_dir) as cp:
        await _check(cp, acme_id, other_id)


async def _check(cp: ControlPlane, acme_id: str, other_id: str) -> None:
    _, acme_key = await cp.create_key(acme_id)
    _, other_key = await cp.create_key(other_id)
    client = cp.client

    finalize = "/admin/invoices/finalize?month=2026-11"
    assert (await client.post(finalize)).status_code == 401
    assert (await client.post(finalize, headers=bearer(acme_key))).status_code in (401, 403)
    first = await client.post(finalize, headers=cp.admin)
    assert first.status_code == 200, first.text
    body = first.json()
    assert len(body["created"]) == 1 and body["empty"] >= 1 and body["failed"] == []
    again = (await client.post(finalize, headers=cp.admin)).json()
    assert again["created"] == [] and again["existing"] == body["created"]
    bad = await client.post("/admin/invoices/finalize?month=2026-13", headers=cp.admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "month"
    [invoice_id] = body["created"]

    own = f"/account/invoices/{invoice_id}"
    admin_path = f"/admin/tenants/{acme_id}/invoices/{invoice_id}"
    for suffix in ("", ".csv", ".pdf", ".html"):
        assert (await client.get(own + suffix)).status_code == 401
        assert (await client.get(own + suffix, headers=bearer(other_key))).status_code == 404
        assert (await client.get(own + suffix, headers=bearer(acme_key))).status_code == 200
        assert (await client.get(admin_path + suffix)).status_code == 401
        assert (await client.get(admin_path + suffix, headers=cp.admin)).status_code == 200
        elsewhere = f"/admin/tenants/{other_id}/invoices/{invoice_id}{suffix}"
        assert (await client.get(elsewhere, headers=cp.admin)).status_code == 404
    assert (await client.get("/account/invoices")).status_code == 401
    assert (await client.get(f"/admin/tenants/{acme_id}/invoices")).status_code == 401
    theirs = await client.get("/account/invoices", headers=bearer(other_key))
    assert [i["status"] for i in theirs.json()["data"]] == ["draft"]  # nothing of acme's
    listed = await client.get("/account/invoices", headers=bearer(acme_key))
    assert [i["status"] for i in listed.json()["data"]] == ["draft", "finalized"]
    for unknown in ("2999-01", "inv_nope", "nonsense", "2026-13", "1999-12", "9999-12.pdf"):
        answer = await client.get(f"/account/invoices/{unknown}", headers=bearer(acme_key))
        assert answer.status_code in (400, 404), (unknown, answer.text)
        assert answer.json()["error"]["param"] == "invoice_id"
    by_month = await client.get("/account/invoices/2026-11", headers=bearer(acme_key))
    assert by_month.json()["id"] == invoice_id

    view = (await client.get(own, headers=bearer(acme_key))).json()
    assert view["status"] == "finalized" and view["number"].startswith("HYD-")
    assert view["period"] == "2026-11" and view["timezone"] == "America/New_York"
    assert {line["model"] for line in view["lines"]} == {"llama-small", "qwen-tiny"}
    amounts = [Decimal(line["amount"]) for line in view["lines"]]
    assert sum(amounts) == Decimal(view["subtotal"])
    assert Decimal(view["credits_applied"]) == Decimal("0.1")
    due = Decimal(view["subtotal"]) - Decimal(view["credits_applied"])
    assert Decimal(view["amount_due"]) == round(due, 2)

    text = (await client.get(own + ".csv", headers=bearer(acme_key))).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["amount"] for r in rows] == [line["amount"] for line in view["lines"]]
    assert [r["credits_applied"] for r in rows] == [
        line["credits_applied"] for line in view["lines"]
    ]
    assert {r["number"] for r in rows} == {view["number"]}

    pdf = await client.get(own + ".pdf", headers=bearer(acme_key))
    assert pdf.headers["content-type"] == "application/pdf"
    assert f'filename="{view["number"]}.pdf"' in pdf.headers["content-disposition"]
    extracted = "".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf.content)).pages)
    for needle in (view["number"], view["subtotal"], view["credits_applied"], view["amount_due"]):
        assert needle in extracted, needle
    for line in view["lines"]:
        assert line["amount"] in extracted and str(line["output_tokens"]) in extracted

    html = (await client.get(own + ".html", headers=bearer(acme_key))).text
    for line in view["lines"]:
        assert f'data-col="amount">{line["amount"]}<' in html
    assert f'data-total="amount_due">{view["amount_due"]} USD<' in html
