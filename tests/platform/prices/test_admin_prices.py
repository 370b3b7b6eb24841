"""`/admin/models` and their price versions: decimal strings in, decimal strings out, no floats."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from control_plane_helpers import ControlPlane
from sqlalchemy import select

from hydrant.platform.db.models import Price


async def _model(cp: ControlPlane, name: str = "llama3") -> dict:
    response = await cp.client.post(
        "/admin/models",
        json={"name": name, "path": "/models/llama3", "quantization": "int8"},
        headers=cp.admin,
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_deployments_are_created_listed_and_unique(cp: ControlPlane) -> None:
    model = await _model(cp)
    assert model["id"].startswith("mdl_") and model["status"] == "active"
    assert model["quantization"] == "int8" and model["max_model_len"] is None
    listed = (await cp.client.get("/admin/models", headers=cp.admin)).json()
    assert [m["name"] for m in listed["data"]] == ["llama3"]
    fetched = await cp.client.get(f"/admin/models/{model['id']}", headers=cp.admin)
    assert fetched.json() == model
    for body, status in (
        ({"name": "llama3", "path": "/x"}, 409),
        ({"name": "bad name", "path": "/x"}, 400),
        ({"name": "q", "path": "/x", "quantization": "fp4"}, 400),
        ({"name": "q"}, 400),
    ):
        response = await cp.client.post("/admin/models", json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)


async def test_prices_are_exact_versions(cp: ControlPlane) -> None:
    model = await _model(cp)
    path = f"/admin/models/{model['id']}/prices"
    later = (cp.clock.wall + timedelta(days=1)).isoformat()
    first = await cp.client.post(
        path, json={"input_per_mtok": "0.15", "output_per_mtok": "0.6"}, headers=cp.admin
    )
    assert first.status_code == 201, first.text
    body = first.json()
    assert body["input_per_mtok"] == "0.150000"
    assert body["cached_input_per_mtok"] == "0.150000"  # defaults to the input price
    assert body["output_per_mtok"] == "0.600000"
    assert body["currency"] == "USD"
    second = await cp.client.post(
        path,
        json={
            "input_per_mtok": "0.0000001234",
            "cached_input_per_mtok": 0,
            "output_per_mtok": 2,
            "effective_from": later,
        },
        headers=cp.admin,
    )
    assert second.status_code == 201, second.text
    assert second.json()["input_per_mtok"] == "0.0000001234"  # more places only when needed
    assert second.json()["cached_input_per_mtok"] == "0.000000"

    versions = (await cp.client.get(path, headers=cp.admin)).json()["data"]
    assert [v["id"] for v in versions] == [body["id"], second.json()["id"]]
    stored = await cp.execute(select(Price.input_per_mtok).where(Price.id == body["id"]))
    assert stored == Decimal("0.15")


async def test_prices_refuse_floats_the_past_and_duplicates(cp: ControlPlane) -> None:
    model = await _model(cp)
    path = f"/admin/models/{model['id']}/prices"
    moment = (cp.clock.wall + timedelta(hours=1)).isoformat()
    ok = {"input_per_mtok": "1", "output_per_mtok": "2", "effective_from": moment}
    assert (await cp.client.post(path, json=ok, headers=cp.admin)).status_code == 201
    cases = [
        ({**ok, "input_per_mtok": 0.15}, 400, "float"),
        ({**ok, "output_per_mtok": 1e-7}, 400, "float"),
        ({**ok, "input_per_mtok": "1.12345678901"}, 400, "decimal places"),
        ({**ok, "input_per_mtok": "-0.1"}, 400, None),
        ({**ok, "input_per_mtok": "12345678901"}, 400, "too large"),
        ({**ok, "currency": "usd"}, 400, None),
        ({**ok, "effective_from": "2026-12-02T12:00:00"}, 400, None),  # no time zone
        ({**ok, "effective_from": (cp.clock.wall - timedelta(hours=1)).isoformat()}, 400, "past"),
        (ok, 409, None),
    ]
    for body, status, message in cases:
        response = await cp.client.post(path, json=body, headers=cp.admin)
        assert response.status_code == status, (body, response.text)
        if message is not None:
            assert message in response.json()["error"]["message"], body
    missing = await cp.client.post("/admin/models/mdl_nope/prices", json=ok, headers=cp.admin)
    assert missing.status_code == 404


async def test_a_version_prices_batch_lines_at_half_unless_it_says_otherwise(
    cp: ControlPlane,
) -> None:
    model = await _model(cp)
    path = f"/admin/models/{model['id']}/prices"
    halved = await cp.client.post(
        path,
        json={"input_per_mtok": "0.15", "cached_input_per_mtok": "0.05", "output_per_mtok": "0.6"},
        headers=cp.admin,
    )
    assert halved.status_code == 201, halved.text
    body = halved.json()
    assert (body["batch_input_per_mtok"], body["batch_cached_input_per_mtok"]) == (
        "0.075000",
        "0.025000",
    )
    assert body["batch_output_per_mtok"] == "0.300000"
    stored = await cp.execute(select(Price.batch_input_per_mtok).where(Price.id == body["id"]))
    assert stored is None  # the default, not a copy of it
    later = (cp.clock.wall + timedelta(days=1)).isoformat()
    set_ = await cp.client.post(
        path,
        json={
            "input_per_mtok": "0.15",
            "output_per_mtok": "0.6",
            "batch_output_per_mtok": "0.5",
            "effective_from": later,
        },
        headers=cp.admin,
    )
    assert set_.json()["batch_output_per_mtok"] == "0.500000"
    assert set_.json()["batch_input_per_mtok"] == "0.075000"
    negative = await cp.client.post(
        path,
        json={"input_per_mtok": "1", "output_per_mtok": "1", "batch_input_per_mtok": "-1"},
        headers=cp.admin,
    )
    assert negative.status_code == 400
