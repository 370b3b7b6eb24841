"""`/admin/models/{base}/adapters`: registration checks the adapter, names are unique per base
model, the adapter's price lives in the price book under `base:adapter`."""

from __future__ import annotations

from pathlib import Path

from control_plane_helpers import ControlPlane, bearer
from peft_dirs import write_adapter


async def _base(cp: ControlPlane, path: Path, name: str = "demo") -> None:
    response = await cp.client.post(
        "/admin/models", json={"name": name, "path": str(path)}, headers=cp.admin
    )
    assert response.status_code == 201, response.text


async def test_register_list_remove(cp: ControlPlane, tmp_path: Path, demo_model_dir: Path) -> None:
    await _base(cp, demo_model_dir)
    tenant, secret = await cp.tenant_with_key("acme")
    path = str(write_adapter(tmp_path / "sql", demo_model_dir))
    body = {
        "name": "sql",
        "path": path,
        "tenant_id": tenant["id"],
        "price": {"input_per_mtok": "0.5", "output_per_mtok": "1.5"},
        "hosting_fee_per_day": "1.25",
    }
    url = "/admin/models/demo/adapters"
    assert (await cp.client.post(url, json=body)).status_code == 401
    assert (await cp.client.post(url, json=body, headers=bearer(secret))).status_code == 403
    created = await cp.client.post(url, json=body, headers=cp.admin)
    assert created.status_code == 201, created.text
    view = created.json()
    assert view["id"].startswith("adp_")
    assert (view["model"], view["tenant_id"], view["path"]) == ("demo:sql", tenant["id"], path)
    assert view["hosting_fee_per_day"] == "1.250000"
    # Its price version is in the price book, under the adapter's own model row.
    prices = await cp.client.get(f"/admin/models/{view['price_model_id']}/prices", headers=cp.admin)
    assert [(p["input_per_mtok"], p["output_per_mtok"]) for p in prices.json()["data"]] == [
        ("0.500000", "1.500000")
    ]
    public = await cp.client.post(
        url, json={"name": "chat", "path": str(write_adapter(tmp_path / "c", demo_model_dir))},
        headers=cp.admin,
    )  # fmt: skip
    assert public.status_code == 201 and public.json()["tenant_id"] is None
    assert public.json()["hosting_fee_per_day"] is None
    listed = (await cp.client.get(url, headers=cp.admin)).json()["data"]
    assert [a["model"] for a in listed] == ["demo:chat", "demo:sql"]

    removed = await cp.client.delete(f"{url}/sql", headers=cp.admin)
    assert removed.status_code == 204, removed.text
    assert (await cp.client.delete(f"{url}/sql", headers=cp.admin)).status_code == 404
    listed = (await cp.client.get(url, headers=cp.admin)).json()["data"]
    assert [a["model"] for a in listed] == ["demo:chat"]
    # Registered again: the same price-book row, its price history kept.
    again = await cp.client.post(url, json={**body, "price": None}, headers=cp.admin)
    assert again.status_code == 201 and again.json()["price_model_id"] == view["price_model_id"]


async def test_bad_registrations_get_clear_errors(
    cp: ControlPlane, tmp_path: Path, demo_model_dir: Path
) -> None:
    await _base(cp, demo_model_dir)
    good = str(write_adapter(tmp_path / "a", demo_model_dir))
    url = "/admin/models/demo/adapters"
    assert (
        await cp.client.post(url, json={"name": "a", "path": good}, headers=cp.admin)
    ).is_success
    cases = [
        (url, {"name": "a", "path": good}, 409, "has an adapter named 'a'"),
        (url, {"name": "bad:name", "path": good}, 400, "matching regex"),
        (url, {"name": "b", "path": good, "tenant_id": "ten_nobody"}, 404, "no tenant"),
        (url, {"name": "b", "path": good, "hosting_fee_per_day": "1"}, 400, "no tenant to charge"),
        (url, {"name": "b", "path": str(tmp_path / "missing")}, 422, "is not a directory"),
        ("/admin/models/nope/adapters", {"name": "b", "path": good}, 404, "no model named"),
        # An adapter's own price-book row is not a base model: adapters do not stack.
        ("/admin/models/demo:a/adapters", {"name": "b", "path": good}, 404, "no model named"),
    ]
    for path, body, status, text in cases:
        response = await cp.client.post(path, json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)
        assert text in response.json()["error"]["message"], response.text
    wrong = tmp_path / "wrong"
    write_adapter(wrong, demo_model_dir, config_overrides={"target_modules": ["lm_head"]})
    response = await cp.client.post(url, json={"name": "w", "path": str(wrong)}, headers=cp.admin)
    assert response.status_code == 422
    assert response.json()["error"]["param"] == "path"
    assert "target_modules ['lm_head'] are not served" in response.json()["error"]["message"]
