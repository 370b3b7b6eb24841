"""`/admin/tenants` through the real app: create, list (paged), get, update, suspend, resume."""

from __future__ import annotations

from control_plane_helpers import ControlPlane


async def test_create_with_defaults_and_refusals(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("  acme  ")
    assert tenant["id"].startswith("ten_")
    assert (tenant["name"], tenant["status"], tenant["timezone"]) == ("acme", "active", "UTC")
    assert tenant["plan_id"] == "pln_default" and tenant["contact_email"] is None

    cases = [
        ({"name": "acme"}, 409, "name"),
        ({"name": "x", "timezone": "Mars/Olympus"}, 400, "timezone"),
        ({"name": "x", "timezone": "../../etc/passwd"}, 400, "timezone"),
        ({"name": "x", "contact_email": "nobody"}, 400, "contact_email"),
        ({"name": "x", "plan": "platinum"}, 404, "plan"),
        ({"name": "   "}, 400, "name"),
        ({"name": "x", "colour": "red"}, 400, None),
        ({}, 400, None),
    ]
    for body, status, param in cases:
        response = await cp.client.post("/admin/tenants", json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)
        if param is not None:
            assert response.json()["error"]["param"] == param, body


async def test_list_pages_in_creation_order(cp: ControlPlane) -> None:
    ids = [(await cp.create_tenant(name))["id"] for name in ("a", "b", "c")]
    first = (await cp.client.get("/admin/tenants?limit=2", headers=cp.admin)).json()
    assert [t["id"] for t in first["data"]] == ids[:2] and first["has_more"] is True
    second = await cp.client.get(f"/admin/tenants?limit=2&after={ids[1]}", headers=cp.admin)
    assert [t["id"] for t in second.json()["data"]] == ids[2:]
    assert second.json()["has_more"] is False
    await cp.client.post(f"/admin/tenants/{ids[0]}/suspend", headers=cp.admin)
    suspended = await cp.client.get("/admin/tenants?status=suspended", headers=cp.admin)
    assert [t["id"] for t in suspended.json()["data"]] == ids[:1]
    for query in ("limit=0", "limit=500", "limit=x", "status=deleted", "after=ten_nope"):
        response = await cp.client.get(f"/admin/tenants?{query}", headers=cp.admin)
        assert response.status_code == 400, query


async def test_update_changes_only_what_is_sent(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme", contact_email="ops@acme.example")
    await cp.create_tenant("beta")
    plan = await cp.client.post("/admin/plans", json={"name": "gold"}, headers=cp.admin)
    path = f"/admin/tenants/{tenant['id']}"

    response = await cp.client.patch(
        path, json={"timezone": "Asia/Shanghai", "plan": "gold"}, headers=cp.admin
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["timezone"], body["plan_id"]) == ("Asia/Shanghai", plan.json()["id"])
    assert (body["name"], body["contact_email"]) == ("acme", "ops@acme.example")

    cleared = await cp.client.patch(path, json={"contact_email": None}, headers=cp.admin)
    assert cleared.json()["contact_email"] is None
    taken = await cp.client.patch(path, json={"name": "beta"}, headers=cp.admin)
    assert taken.status_code == 409
    missing = await cp.client.patch("/admin/tenants/ten_nope", json={}, headers=cp.admin)
    assert missing.status_code == 404
    fetched = await cp.client.get(path, headers=cp.admin)
    assert fetched.json()["name"] == "acme" and fetched.json()["timezone"] == "Asia/Shanghai"


async def test_suspend_and_resume_are_idempotent(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    for action, status in (
        ("suspend", "suspended"),
        ("suspend", "suspended"),
        ("resume", "active"),
    ):
        response = await cp.client.post(f"/admin/tenants/{tenant['id']}/{action}", headers=cp.admin)
        assert (response.status_code, response.json()["status"]) == (200, status)
