"""A tenant's invoices pages: the draft and the finalized invoice with its lines and totals,
the PDF and CSV downloads under the page's session, another tenant's a 404, an admin
sees any tenant's, anonymous is sent to sign in."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from control_plane_helpers import ControlPlane
from pypdf import PdfReader
from report_factories import add_models, insert_rows, row
from web_helpers import sign_in

from hydrant.platform.services import services_of

NOVEMBER = datetime(2026, 11, 12, 15, 0, tzinfo=UTC)


async def test_a_tenant_sees_its_invoices_and_downloads_the_pdf(cp: ControlPlane) -> None:
    acme, acme_key = await cp.tenant_with_key("acme")
    globex, _ = await cp.tenant_with_key("globex")

    async def write() -> None:
        async with services_of(cp.app).database.session() as session:
            models = await add_models(session, ["demo", "other"])
            await insert_rows(
                session,
                [
                    row(acme["id"], "demo", NOVEMBER, "1.250000", request_id="a1"),
                    row(acme["id"], "other", NOVEMBER, "0.000500", request_id="a2"),
                    row(globex["id"], "demo", NOVEMBER, "9.000000", request_id="g1"),
                ],
                models,
            )

    await cp.in_app(write)
    finalized = await cp.client.post("/admin/invoices/finalize?month=2026-11", headers=cp.admin)
    assert finalized.status_code == 200, finalized.text
    path = f"/ui/tenants/{acme['id']}/invoices"
    anonymous = await cp.client.get(path)
    assert anonymous.status_code == 303 and "/ui/sign-in" in anonymous.headers["location"]

    await sign_in(cp.client, acme_key)
    listing = await cp.client.get(path)
    assert listing.status_code == 200, listing.text
    assert "HYD-2026-00000" in listing.text and "Draft" in listing.text
    assert "1.250500 USD" in listing.text and "9.000000" not in listing.text
    assert f'href="/ui/tenants/{acme["id"]}/invoices"' in listing.text  # in the tenant's nav

    page = await cp.client.get(f"{path}/2026-11")
    assert page.status_code == 200, page.text
    assert 'data-total="amount_due">1.25 USD<' in page.text
    assert "demo, no price version" in page.text and "other, no price version" in page.text
    pdf = await cp.client.get(f"{path}/2026-11.pdf")
    assert pdf.status_code == 200 and pdf.headers["content-type"] == "application/pdf"
    text = PdfReader(io.BytesIO(pdf.content)).pages[0].extract_text()
    assert "Amount due: 1.25 USD" in text and "1.250000" in text
    other = await cp.client.get(f"/ui/tenants/{globex['id']}/invoices/2026-11")
    assert other.status_code == 404
    other_pdf = await cp.client.get(f"/ui/tenants/{globex['id']}/invoices/2026-11.pdf")
    assert other_pdf.status_code == 404

    await sign_in(cp.client, cp.admin_secret)
    admin = await cp.client.get(f"/ui/tenants/{globex['id']}/invoices/2026-11")
    assert admin.status_code == 200 and 'data-total="amount_due">9.00 USD<' in admin.text
