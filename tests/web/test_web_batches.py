"""A tenant's batches page: its own batches with what their lines were charged (from the
ledger), another tenant's page a 404, an admin sees any tenant's, anonymous signs in."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from control_plane_helpers import ControlPlane
from report_factories import add_models, insert_rows, row
from web_helpers import sign_in

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Batch
from hydrant.platform.services import services_of


async def test_a_tenant_sees_its_batches_and_their_charges(cp: ControlPlane) -> None:
    acme, acme_key = await cp.tenant_with_key("acme")
    globex, _ = await cp.tenant_with_key("globex")
    now = utcnow()

    async def write() -> None:
        async with services_of(cp.app).database.session() as session:
            models = await add_models(session, ["demo"])
            for batch_id, tenant in (("batch_acme", acme["id"]), ("batch_globex", globex["id"])):
                session.add(
                    Batch(
                        id=batch_id,
                        tenant_id=tenant,
                        endpoint="/v1/chat/completions",
                        model="demo",
                        input_file_id="file-x",
                        status="completed",
                        request_total=2,
                        request_completed=2,
                        output_file_id="file-out",
                        expires_at=now + timedelta(hours=24),
                    )
                )
            await session.flush()
            lines = [
                row(acme["id"], "demo", now, "0.000125", request_id="l1", batch_id="batch_acme"),
                row(acme["id"], "demo", now, "0.000250", request_id="l2", batch_id="batch_acme"),
                row(acme["id"], "demo", now, "1.000000", request_id="i1"),  # interactive
            ]
            await insert_rows(session, lines, models)

    await cp.in_app(write)
    path = f"/ui/tenants/{acme['id']}/batches"
    anonymous = await cp.client.get(path)
    assert anonymous.status_code == 303 and "/ui/sign-in" in anonymous.headers["location"]

    await sign_in(cp.client, acme_key)
    page = await cp.client.get(path)
    assert page.status_code == 200, page.text
    assert "batch_acme" in page.text and "batch_globex" not in page.text
    assert f"{Decimal('0.000375'):f}" in page.text  # its two lines, not the interactive entry
    assert "file-out" in page.text
    assert 'href="/ui/tenants/' in page.text and "/batches" in page.text
    other = await cp.client.get(f"/ui/tenants/{globex['id']}/batches")
    assert other.status_code == 404

    await sign_in(cp.client, cp.admin_secret)
    admin = await cp.client.get(f"/ui/tenants/{globex['id']}/batches")
    assert admin.status_code == 200 and "batch_globex" in admin.text
    assert "batch_acme" not in admin.text
