"""Every control-plane route, found by walking the app: anonymous 401, wrong kind of key 403,
another tenant's object 404, the owner (or an admin) 200."""

from __future__ import annotations

import re

from control_plane_helpers import ControlPlane, bearer
from litestar.routes import HTTPRoute

GUARDED_PREFIXES = ("/admin/", "/account")


def _guarded_routes(cp: ControlPlane) -> list[tuple[str, str]]:
    found = []
    for route in cp.app.routes:
        if not isinstance(route, HTTPRoute) or not route.path.startswith(GUARDED_PREFIXES):
            continue
        path = re.sub(r"\{(\w+):\w+\}", "obj_x", route.path)
        found.extend((m, path) for m in sorted(route.methods) if m not in ("OPTIONS", "HEAD"))
    return found


async def test_every_route_refuses_anonymous_and_the_wrong_kind_of_key(cp: ControlPlane) -> None:
    _, tenant_secret = await cp.tenant_with_key("acme")
    routes = _guarded_routes(cp)
    assert len(routes) >= 20, routes  # the walk found the control plane
    for method, path in routes:
        response = await cp.client.request(method, path, json={"junk": True})
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["error"]["type"] == "authentication_error"
        wrong = bearer(tenant_secret) if path.startswith("/admin/") else cp.admin
        response = await cp.client.request(method, path, json={"junk": True}, headers=wrong)
        assert response.status_code == 403, (method, path, response.text)


async def test_a_tenant_sees_only_its_own_keys(cp: ControlPlane) -> None:
    acme, acme_secret = await cp.tenant_with_key("acme")
    beta = await cp.create_tenant("beta")
    beta_key, _ = await cp.create_key(beta["id"])

    own = await cp.client.get("/account/keys", headers=bearer(acme_secret))
    assert own.status_code == 200
    keys = own.json()["data"]
    assert [k["tenant_id"] for k in keys] == [acme["id"]]
    assert all("secret" not in k and "key_hash" not in k for k in keys)

    response = await cp.client.get(f"/account/keys/{keys[0]['id']}", headers=bearer(acme_secret))
    assert response.status_code == 200
    others = await cp.client.get(f"/account/keys/{beta_key['id']}", headers=bearer(acme_secret))
    missing = await cp.client.get("/account/keys/key_nope", headers=bearer(acme_secret))
    assert others.status_code == missing.status_code == 404
    assert others.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    # A cursor from another tenant's list is an unknown cursor, not a window into it.
    response = await cp.client.get(
        "/account/keys", params={"after": beta_key["id"]}, headers=bearer(acme_secret)
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "after"

    account = await cp.client.get("/account", headers=bearer(acme_secret))
    assert account.json()["tenant"]["id"] == acme["id"]


async def test_an_admin_reaches_every_tenant_and_missing_objects_are_404(
    cp: ControlPlane,
) -> None:
    acme = await cp.create_tenant("acme")
    key, _ = await cp.create_key(acme["id"])
    for path in (f"/admin/tenants/{acme['id']}", f"/admin/keys/{key['id']}"):
        assert (await cp.client.get(path, headers=cp.admin)).status_code == 200
    for path in (
        "/admin/tenants/ten_nope",
        "/admin/keys/key_nope",
        "/admin/plans/pln_nope",
        "/admin/models/mdl_nope",
        "/admin/models/mdl_nope/prices",
    ):
        response = await cp.client.get(path, headers=cp.admin)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"
