"""`/admin/tenants/{id}/billing-customer`: admins set, read and clear a tenant's Stripe
customer; anonymous 401, a tenant key refused, an unknown tenant 404, a malformed id 400."""

from __future__ import annotations

from control_plane_helpers import ControlPlane, bearer


async def test_admins_set_read_and_clear_the_stripe_customer(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    path = f"/admin/tenants/{tenant['id']}/billing-customer"
    assert (await cp.client.get(path)).status_code == 401
    assert (await cp.client.get(path, headers=bearer(secret))).status_code in (401, 403)
    missing = await cp.client.get("/admin/tenants/ten_nope/billing-customer", headers=cp.admin)
    assert missing.status_code == 404

    first = await cp.client.get(path, headers=cp.admin)
    assert first.json() == {"tenant_id": tenant["id"], "stripe_customer_id": None}
    put = await cp.client.put(path, json={"stripe_customer_id": "cus_Acme123"}, headers=cp.admin)
    assert put.status_code == 200, put.text
    read = await cp.client.get(path, headers=cp.admin)
    assert read.json()["stripe_customer_id"] == "cus_Acme123"

    bad = await cp.client.put(path, json={"stripe_customer_id": "x' OR 1=1"}, headers=cp.admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stripe_customer_id"
    cleared = await cp.client.put(path, json={"stripe_customer_id": None}, headers=cp.admin)
    assert cleared.json()["stripe_customer_id"] is None
    assert (await cp.client.get(path, headers=cp.admin)).json()["stripe_customer_id"] is None
