"""`/admin/tenants/{id}/projects` and `/account/projects` through the real app, on each
database: create, list, rename, budget, archive; keys made in a project; the three cases."""

from __future__ import annotations

from control_plane_helpers import ControlPlane, bearer
from sqlalchemy import select

from hydrant.platform.db.models import ApiKey


async def test_create_list_update_archive_and_refusals(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    other = await cp.create_tenant("globex")
    base = f"/admin/tenants/{tenant['id']}/projects"
    made = await cp.client.post(
        base, json={"name": " web ", "spend_per_day": "5.5"}, headers=cp.admin
    )
    assert made.status_code == 201, made.text
    project = made.json()
    assert project["id"].startswith("proj_") and project["name"] == "web"
    assert (project["status"], project["spend_per_day"], project["tokens_per_day"]) == (
        "active",
        "5.500000",
        None,
    )
    # The same name in another tenant is fine; in the same tenant it is a conflict.
    elsewhere = await cp.client.post(
        f"/admin/tenants/{other['id']}/projects", json={"name": "web"}, headers=cp.admin
    )
    assert elsewhere.status_code == 201, elsewhere.text
    cases = [
        ({"name": "web"}, 409, "name"),
        ({"name": "  "}, 400, "name"),
        ({"name": "x", "spend_per_day": 0.5}, 400, None),  # a float: money is a string
        ({"name": "x", "spend_per_day": "0.1234567"}, 400, "spend_per_day"),
        ({"name": "x", "tokens_per_day": -1}, 400, None),
        ({"name": "x", "requests_per_minute": -1}, 400, None),
        ({"name": "x", "colour": "red"}, 400, None),
    ]
    for body, status, param in cases:
        response = await cp.client.post(base, json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)
        if param is not None:
            assert response.json()["error"]["param"] == param, body
    missing = await cp.client.post(
        "/admin/tenants/ten_nope/projects", json={"name": "x"}, headers=cp.admin
    )
    assert missing.status_code == 404

    renamed = await cp.client.patch(
        f"{base}/{project['id']}",
        json={
            "name": "site",
            "tokens_per_month": 1000,
            "spend_per_day": None,
            "requests_per_minute": 30,
        },
        headers=cp.admin,
    )
    assert renamed.status_code == 200, renamed.text
    body = renamed.json()
    assert (body["name"], body["tokens_per_month"], body["spend_per_day"]) == ("site", 1000, None)
    assert body["requests_per_minute"] == 30 and body["tokens_per_minute"] is None
    by_name = await cp.client.get(f"{base}/site", headers=cp.admin)
    assert by_name.json()["id"] == project["id"]

    archived = await cp.client.post(f"{base}/{project['id']}/archive", headers=cp.admin)
    assert archived.status_code == 200 and archived.json()["status"] == "archived"
    assert archived.json()["archived_at"] is not None
    listed = await cp.client.get(base, headers=cp.admin)
    assert listed.json()["data"] == []
    everything = await cp.client.get(f"{base}?archived=true", headers=cp.admin)
    assert [p["id"] for p in everything.json()["data"]] == [project["id"]]
    # Another tenant's project is not found under this tenant.
    crossed = await cp.client.get(
        f"/admin/tenants/{other['id']}/projects/{project['id']}", headers=cp.admin
    )
    assert crossed.status_code == 404


async def test_keys_join_a_project_and_keep_it_when_rotated(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    other = await cp.create_tenant("globex")
    base = f"/admin/tenants/{tenant['id']}/projects"
    project = (await cp.client.post(base, json={"name": "web"}, headers=cp.admin)).json()
    foreign = (
        await cp.client.post(
            f"/admin/tenants/{other['id']}/projects", json={"name": "ops"}, headers=cp.admin
        )
    ).json()

    key, _ = await cp.create_key(
        tenant["id"], project="web", tokens_per_day=100, spend_per_month="2.5"
    )  # by name, with budgets of its own
    assert key["project_id"] == project["id"]
    assert (key["tokens_per_day"], key["spend_per_month"]) == (100, "2.500000")
    plain, _ = await cp.create_key(tenant["id"])
    assert plain["project_id"] is None  # a tenant-level key
    rotated = await cp.client.post(f"/admin/keys/{key['id']}/rotate", json={}, headers=cp.admin)
    assert rotated.status_code == 200, rotated.text
    new_id = rotated.json()["key"]["id"]
    stored = await cp.execute(select(ApiKey.project_id).where(ApiKey.id == new_id))
    assert stored == project["id"]
    assert rotated.json()["key"]["tokens_per_day"] == 100  # the budgets go with it

    refused = [
        ({"tenant_id": tenant["id"], "project": foreign["id"]}, 404),  # another tenant's
        ({"tenant_id": tenant["id"], "project": "nope"}, 404),
        ({"tenant_id": None, "project": "web"}, 400),  # an admin key has no project
        ({"tenant_id": None, "tokens_per_day": 5}, 400),  # nor budgets
        ({"tenant_id": tenant["id"], "spend_per_day": "-1"}, 400),
        ({"tenant_id": tenant["id"], "tokens_per_day": -1}, 400),
    ]
    for body, status in refused:
        response = await cp.client.post("/admin/keys", json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)
    await cp.client.post(f"{base}/{project['id']}/archive", headers=cp.admin)
    archived = await cp.client.post(
        "/admin/keys", json={"tenant_id": tenant["id"], "project": "web"}, headers=cp.admin
    )
    assert archived.status_code == 400 and archived.json()["error"]["param"] == "project"


async def test_account_projects_three_cases(cp: ControlPlane) -> None:
    tenant, secret = await cp.tenant_with_key("acme")
    _, other_secret = await cp.tenant_with_key("globex")
    project = (
        await cp.client.post(
            f"/admin/tenants/{tenant['id']}/projects", json={"name": "web"}, headers=cp.admin
        )
    ).json()
    path = f"/account/projects/{project['id']}"

    anonymous = await cp.client.get(path)
    assert anonymous.status_code == 401
    foreign = await cp.client.get(path, headers=bearer(other_secret))
    assert foreign.status_code == 404  # existence is not revealed
    assert (await cp.client.get("/account/projects", headers=bearer(other_secret))).json()[
        "data"
    ] == []
    owner = await cp.client.get(path, headers=bearer(secret))
    assert owner.status_code == 200 and owner.json()["name"] == "web"
    listed = await cp.client.get("/account/projects", headers=bearer(secret))
    assert [p["id"] for p in listed.json()["data"]] == [project["id"]]
    # A tenant key cannot change projects: the admin routes refuse it.
    made = await cp.client.post(
        f"/admin/tenants/{tenant['id']}/projects", json={"name": "x"}, headers=bearer(secret)
    )
    assert made.status_code in (401, 403)
    assert (
        await cp.client.post(f"/admin/tenants/{tenant['id']}/projects", json={})
    ).status_code == 401


async def test_a_keys_budgets_are_changed_after_creation(cp: ControlPlane) -> None:
    """`PATCH /admin/keys/{id}`: given fields change, `null` clears, the rest stay; bad
    values are 400s naming the field; admin keys and dead keys are refused."""
    tenant = await cp.create_tenant("acme")
    key, _ = await cp.create_key(tenant["id"], tokens_per_day=100, spend_per_month="2.5")
    url = f"/admin/keys/{key['id']}"
    changed = await cp.client.patch(
        url, json={"tokens_per_month": 5000, "spend_per_month": None}, headers=cp.admin
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["tokens_per_day"], body["tokens_per_month"], body["spend_per_month"]) == (
        100,
        5000,
        None,
    )
    stored = await cp.execute(select(ApiKey.tokens_per_month).where(ApiKey.id == key["id"]))
    assert stored == 5000
    money = await cp.client.patch(url, json={"spend_per_day": "7.25"}, headers=cp.admin)
    assert money.json()["spend_per_day"] == "7.250000" and money.json()["tokens_per_day"] == 100

    refused: list[tuple[dict[str, object], int, str | None]] = [
        ({"spend_per_day": "-1"}, 400, "spend_per_day"),
        ({"spend_per_day": "0.1234567"}, 400, "spend_per_day"),
        ({"spend_per_day": 0.5}, 400, None),  # a float: money is a string
        ({"tokens_per_day": -1}, 400, None),
        ({"tokens_per_day": 2**63}, 400, None),
        ({"name": "renamed"}, 400, None),  # only budgets change here
    ]
    for patch_body, status, param in refused:
        response = await cp.client.patch(url, json=patch_body, headers=cp.admin)
        assert response.status_code == status, (patch_body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], patch_body
        if param is not None:
            assert error["param"] == param, patch_body
    unchanged = await cp.client.get(url, headers=cp.admin)
    assert unchanged.json()["spend_per_day"] == "7.250000"  # nothing refused was applied

    admin_key = await cp.client.post("/admin/keys", json={"tenant_id": None}, headers=cp.admin)
    no_budgets = await cp.client.patch(
        f"/admin/keys/{admin_key.json()['key']['id']}",
        json={"tokens_per_day": 5},
        headers=cp.admin,
    )
    assert no_budgets.status_code == 400, no_budgets.text
    assert no_budgets.json()["error"]["param"] == "tokens_per_day"
    missing = await cp.client.patch("/admin/keys/key_nope", json={}, headers=cp.admin)
    assert missing.status_code == 404
    await cp.client.post(f"{url}/revoke", headers=cp.admin)
    revoked = await cp.client.patch(url, json={"tokens_per_day": 5}, headers=cp.admin)
    assert revoked.status_code == 409 and "revoked" in revoked.json()["error"]["message"]


async def test_only_admin_keys_change_key_budgets(cp: ControlPlane) -> None:
    tenant = await cp.create_tenant("acme")
    key, secret = await cp.create_key(tenant["id"], tokens_per_day=100)
    url = f"/admin/keys/{key['id']}"
    anonymous = await cp.client.patch(url, json={"tokens_per_day": 10**9})
    assert anonymous.status_code == 401
    own = await cp.client.patch(url, json={"tokens_per_day": 10**9}, headers=bearer(secret))
    assert own.status_code in (401, 403), own.text  # a tenant raises no budget of its own
    stored = await cp.execute(select(ApiKey.tokens_per_day).where(ApiKey.id == key["id"]))
    assert stored == 100
