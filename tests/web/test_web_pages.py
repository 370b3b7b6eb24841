"""Tenants, keys, models and prices on the pages: each action through the real services."""

from __future__ import annotations

import html
import re
from decimal import Decimal

from control_plane_helpers import ControlPlane, bearer
from web_helpers import post_form, sign_in


async def _signed_in(cp: ControlPlane) -> None:
    assert (await sign_in(cp.client, cp.admin_secret)).status_code == 303


async def test_create_tenant_then_suspend_activate_and_change_plan(cp: ControlPlane) -> None:
    await _signed_in(cp)
    plan = await cp.client.post("/admin/plans", json={"name": "gold"}, headers=cp.admin)
    assert plan.status_code == 201
    created = await post_form(
        cp.client,
        "/ui/tenants",
        {"name": "acme", "timezone": "Europe/Paris"},
        token_from="/ui/tenants",
    )
    assert created.status_code == 303
    tenant_path = created.headers["location"].split("?")[0]
    tenant_id = tenant_path.rsplit("/", 1)[1]
    page = await cp.client.get(created.headers["location"])
    assert (
        page.status_code == 200 and "Tenant created." in page.text and "<h1>acme</h1>" in page.text
    )

    suspended = await post_form(
        cp.client, f"{tenant_path}/status", {"action": "suspend"}, token_from=tenant_path
    )
    assert suspended.status_code == 303
    api = await cp.client.get(f"/admin/tenants/{tenant_id}", headers=cp.admin)
    assert api.json()["status"] == "suspended"
    await post_form(
        cp.client, f"{tenant_path}/status", {"action": "activate"}, token_from=tenant_path
    )
    api = await cp.client.get(f"/admin/tenants/{tenant_id}", headers=cp.admin)
    assert api.json()["status"] == "active"

    changed = await post_form(
        cp.client, f"{tenant_path}/plan", {"plan": plan.json()["id"]}, token_from=tenant_path
    )
    assert changed.status_code == 303
    api = await cp.client.get(f"/admin/tenants/{tenant_id}", headers=cp.admin)
    assert api.json()["plan_id"] == plan.json()["id"]


async def test_bad_tenant_input_is_a_message_on_the_page(cp: ControlPlane) -> None:
    await _signed_in(cp)
    await cp.create_tenant("taken")
    cases = {
        "   ": "name: must not be blank",
        "taken": "a tenant named 'taken' exists",
        "x" * 201: "name: has at most 200 characters",
    }
    for name, message in cases.items():
        response = await post_form(
            cp.client, "/ui/tenants", {"name": name}, token_from="/ui/tenants"
        )
        assert response.status_code in (400, 409), (name, response.text)
        assert message in html.unescape(response.text), (name, response.text)
        assert 'role="alert"' in response.text
    bad_zone = await post_form(
        cp.client,
        "/ui/tenants",
        {"name": "zoned", "timezone": "Mars/Base"},
        token_from="/ui/tenants",
    )
    assert bad_zone.status_code == 400 and "unknown time zone" in bad_zone.text
    assert 'value="zoned"' in bad_zone.text  # the form keeps what was typed
    tenant = await cp.create_tenant("planless")
    bad_plan = await post_form(
        cp.client,
        f"/ui/tenants/{tenant['id']}/plan",
        {"plan": "no-such-plan"},
        token_from=f"/ui/tenants/{tenant['id']}",
    )
    assert bad_plan.status_code == 404 and "no plan" in bad_plan.text


async def test_key_is_shown_once_then_revoked_and_rotated(cp: ControlPlane) -> None:
    await _signed_in(cp)
    tenant = await cp.create_tenant("acme")
    path = f"/ui/tenants/{tenant['id']}"
    created = await post_form(cp.client, f"{path}/keys", {"name": "ci"}, token_from=path)
    assert created.status_code == 303
    shown_path = created.headers["location"]
    shown = await cp.client.get(shown_path)
    assert shown.status_code == 200
    secret = re.search(r'id="secret" class="secret" type="text" value="([^"]+)"', shown.text)
    assert secret is not None
    key = secret.group(1)
    usable = await cp.client.get("/account", headers=bearer(key))
    assert usable.status_code == 200  # the shown secret is the real key
    again = await cp.client.get(shown_path)
    assert again.status_code == 410 and key not in again.text
    listing = await cp.client.get(path)
    assert key not in listing.text and "ci" in listing.text

    key_id = re.search(r'data-key-id="(key_[^"]+)"', listing.text)
    assert key_id is not None
    rotated = await post_form(
        cp.client, f"/ui/keys/{key_id.group(1)}/rotate", {"grace_hours": "0"}, token_from=path
    )
    assert rotated.status_code == 303
    new_page = await cp.client.get(rotated.headers["location"])
    new_key = re.search(r'id="secret" class="secret" type="text" value="([^"]+)"', new_page.text)
    assert new_key is not None and new_key.group(1) != key
    assert (await cp.client.get("/account", headers=bearer(new_key.group(1)))).status_code == 200
    cp.clock.advance(1)
    assert (await cp.client.get("/account", headers=bearer(key))).status_code == 401

    listing = await cp.client.get(path)
    new_id = re.findall(r'data-key-id="(key_[^"]+)"', listing.text)
    active = [k for k in new_id if k != key_id.group(1)]
    revoked = await post_form(cp.client, f"/ui/keys/{active[0]}/revoke", {}, token_from=path)
    assert revoked.status_code == 303
    cp.clock.advance(10)  # past the key cache
    assert (await cp.client.get("/account", headers=bearer(new_key.group(1)))).status_code == 401
    bad = await post_form(
        cp.client, f"/ui/keys/{active[0]}/rotate", {"grace_hours": "x"}, token_from=path
    )
    assert bad.status_code == 400 and "whole number" in bad.text


async def test_models_and_prices(cp: ControlPlane) -> None:
    await _signed_in(cp)
    added = await post_form(
        cp.client,
        "/ui/models",
        {"name": "llama3", "path": "/models/llama3"},
        token_from="/ui/models",
    )
    assert added.status_code == 303
    models = (await cp.client.get("/admin/models", headers=cp.admin)).json()["data"]
    model_id = next(m["id"] for m in models if m["name"] == "llama3")
    priced = await post_form(
        cp.client,
        f"/ui/models/{model_id}/prices",
        {"input_per_mtok": "0.25", "output_per_mtok": "1.5"},
        token_from="/ui/models",
    )
    assert priced.status_code == 303
    prices = (await cp.client.get(f"/admin/models/{model_id}/prices", headers=cp.admin)).json()
    assert [
        (Decimal(p["input_per_mtok"]), Decimal(p["output_per_mtok"])) for p in prices["data"]
    ] == [(Decimal("0.25"), Decimal("1.5"))]
    page = await cp.client.get("/ui/models")
    assert "llama3" in page.text and "0.250000" in page.text
    bad = await post_form(
        cp.client,
        f"/ui/models/{model_id}/prices",
        {"input_per_mtok": "cheap", "output_per_mtok": "1"},
        token_from="/ui/models",
    )
    assert bad.status_code == 400 and 'role="alert"' in bad.text
    bad_name = await post_form(
        cp.client, "/ui/models", {"name": "bad name!", "path": "/x"}, token_from="/ui/models"
    )
    assert bad_name.status_code == 400 and "name:" in bad_name.text
    missing = await post_form(
        cp.client,
        "/ui/models/mod_missing/prices",
        {"input_per_mtok": "1", "output_per_mtok": "1"},
        token_from="/ui/models",
    )
    assert missing.status_code == 404


async def test_unknown_objects_are_404_pages_not_500(cp: ControlPlane) -> None:
    await _signed_in(cp)
    for path in ("/ui/tenants/ten_missing", "/ui/tenants/ten_missing/usage"):
        response = await cp.client.get(path)
        assert response.status_code == 404, path
        assert "text/html" in response.headers["content-type"]
    revoke = await post_form(cp.client, "/ui/keys/key_missing/revoke", {}, token_from="/ui/tenants")
    assert revoke.status_code == 404
