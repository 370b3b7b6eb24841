"""`GET /admin/reports/costs` and `GET /v1/usage` through the real app, on each backend."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from control_plane_helpers import ControlPlane, bearer
from report_factories import Row, add_models, insert_rows, row

from hydrant.platform.billing.money import round_money
from hydrant.platform.services import services_of

DAY = datetime(2026, 3, 5, tzinfo=UTC)
PERIOD = {
    "since": "2026-03-05",
    "until": "2026-03-05",
}  # the whole 5th: a date `until` counts through that day


async def seed(cp: ControlPlane) -> tuple[dict[str, Any], str, dict[str, Any], str, list[Row]]:
    """Two tenants with a key each, and awkward charges for both on two models."""
    acme, acme_key = await cp.tenant_with_key("acme")
    globex, globex_key = await cp.tenant_with_key("globex")
    entries = [
        row(acme["id"], "alpha", DAY + timedelta(hours=1), "0.333333", request_id="r1",
            device_cost="0.100001", tokens=(100, 40, 7)),
        row(acme["id"], "alpha", DAY + timedelta(hours=2), "0.333334", request_id="r2",
            device_cost="0.5", batch_id="batch_1"),  # a Batch API line: shown apart too
        row(acme["id"], "beta", DAY + timedelta(hours=3), "0.005", request_id="r3",
            device_cost="0.004999"),
        row(globex["id"], "beta", DAY + timedelta(hours=4), "12345.678901", request_id="r4",
            device_cost="20000"),
    ]  # fmt: skip

    async def write() -> None:
        async with services_of(cp.app).database.session() as session:
            models = await add_models(session, ["alpha", "beta"])
            await insert_rows(session, entries, models)

    await cp.in_app(write)
    return acme, acme_key, globex, globex_key, entries


async def test_admin_cost_report_json(cp: ControlPlane) -> None:
    acme, _, globex, _, entries = await seed(cp)
    response = await cp.client.get("/admin/reports/costs", params=PERIOD, headers=cp.admin)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "cost_report"
    assert body["period"] == {
        "since": "2026-03-05T00:00:00Z",
        "until": "2026-03-06T00:00:00Z",
        "group_by": "day",
        "by": None,  # no attribution asked for: every row's `group` is null
    }
    assert {r["group"] for r in body["data"]} == {None}
    assert [(r["tenant_id"], r["model"]) for r in body["data"]] == sorted(
        [(acme["id"], "alpha"), (acme["id"], "beta"), (globex["id"], "beta")]
    )
    alpha = next(r for r in body["data"] if r["model"] == "alpha")
    assert alpha == {
        "bucket": "2026-03-05T00:00:00Z",
        "tenant_id": acme["id"],
        "model": "alpha",
        "requests": 2,
        "input_tokens": 110,
        "cached_tokens": 40,
        "output_tokens": 12,
        "charged": "0.666667",
        "device_seconds": "1.000000000",
        "device_cost": "0.600001",
        "device_cost_estimated": False,  # measured: no upstream pool serves alpha
        "margin": "0.066666",
        "batch_requests": 1,
        "batch_charged": "0.333334",
        "group": None,
    }
    charged = sum((e.charged for e in entries), Decimal(0))
    cost = sum((e.device_cost for e in entries), Decimal(0))
    totals = body["totals"]
    assert totals["charged"] == "12346.350568" == f"{charged:f}"
    assert totals["margin"] == f"{charged - cost:f}" == "-7654.254432"
    assert totals["rounded"] == {
        "charged": f"{round_money(charged, 2):f}",
        "device_cost": "20000.60",  # 20000.605000: half-even, not half-up
        "margin": "-7654.25",
        "batch_charged": "0.33",
    }
    assert (totals["batch_requests"], totals["batch_charged"]) == (1, "0.333334")
    for value in [*totals.values(), *body["data"][0].values()]:
        assert not isinstance(value, float)


async def test_admin_filters_and_hourly_buckets(cp: ControlPlane) -> None:
    acme, _, _, _, _ = await seed(cp)
    params = {**PERIOD, "tenant_id": acme["id"], "model": "alpha", "group_by": "hour"}
    response = await cp.client.get("/admin/reports/costs", params=params, headers=cp.admin)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["bucket"] for r in body["data"]] == ["2026-03-05T01:00:00Z", "2026-03-05T02:00:00Z"]
    assert body["totals"]["charged"] == "0.666667"
    assert (body["tenant_id"], body["model"]) == (acme["id"], "alpha")


async def test_csv_has_a_header_and_the_json_numbers(cp: ControlPlane) -> None:
    await seed(cp)
    as_json = await cp.client.get("/admin/reports/costs", params=PERIOD, headers=cp.admin)
    response = await cp.client.get(
        "/admin/reports/costs", params={**PERIOD, "format": "csv"}, headers=cp.admin
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert (
        'filename="hydrant-costs-20260305-20260306.csv"' in response.headers["content-disposition"]
    )
    lines = list(csv.reader(io.StringIO(response.text)))
    # The JSON rows' columns; `group` only in a report by an attribution (`by`).
    assert lines[0] == [k for k in as_json.json()["data"][0] if k != "group"]
    records = [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    expected = [{k: str(v) for k, v in r.items() if k != "group"} for r in as_json.json()["data"]]
    assert records == expected
    assert sum(Decimal(r["charged"]) for r in records) == Decimal(
        as_json.json()["totals"]["charged"]
    )


async def test_admin_report_refuses_tenant_keys_and_anonymous(cp: ControlPlane) -> None:
    _, acme_key, _, _, _ = await seed(cp)
    anonymous = await cp.client.get("/admin/reports/costs", params=PERIOD)
    assert anonymous.status_code == 401
    tenant = await cp.client.get("/admin/reports/costs", params=PERIOD, headers=bearer(acme_key))
    assert tenant.status_code == 403


async def test_bad_parameters_are_400_naming_them(cp: ControlPlane) -> None:
    for params, param in [
        ({"group_by": "week"}, "group_by"),
        ({"format": "xml"}, "format"),
        ({"since": "last tuesday"}, "since"),
        ({"since": "2026-03-06", "until": "2026-03-05"}, "since"),
    ]:
        response = await cp.client.get("/admin/reports/costs", params=params, headers=cp.admin)
        assert response.status_code == 400, params
        assert response.json()["error"]["param"] == param


async def test_usage_is_the_callers_own(cp: ControlPlane) -> None:
    acme, acme_key, globex, globex_key, _ = await seed(cp)
    anonymous = await cp.client.get("/v1/usage", params=PERIOD)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "authentication_error"

    response = await cp.client.get("/v1/usage", params=PERIOD, headers=bearer(acme_key))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "usage"
    assert [(r["model"], r["charged"]) for r in body["data"]] == [
        ("alpha", "0.666667"),
        ("beta", "0.005000"),
    ]
    assert body["totals"]["charged"] == "0.671667"
    assert body["totals"]["rounded"] == {"charged": "0.67", "batch_charged": "0.33"}
    assert [r["batch_charged"] for r in body["data"]] == ["0.333334", "0.000000"]
    text = response.text
    assert globex["id"] not in text and "12345" not in text  # the other tenant is absent
    assert "device_cost" not in text and "margin" not in text  # the platform's cost is not shown

    other = await cp.client.get("/v1/usage", params=PERIOD, headers=bearer(globex_key))
    assert [r["charged"] for r in other.json()["data"]] == ["12345.678901"]
    assert acme["id"] not in other.text


async def test_usage_ignores_a_tenant_filter_and_serves_csv(cp: ControlPlane) -> None:
    _, acme_key, globex, _, _ = await seed(cp)
    sneaky = await cp.client.get(
        "/v1/usage", params={**PERIOD, "tenant_id": globex["id"]}, headers=bearer(acme_key)
    )
    assert sneaky.status_code == 200
    assert sneaky.json()["totals"]["charged"] == "0.671667"
    response = await cp.client.get(
        "/v1/usage", params={**PERIOD, "format": "csv"}, headers=bearer(acme_key)
    )
    assert response.status_code == 200
    lines = list(csv.reader(io.StringIO(response.text)))
    assert lines[0] == [
        "bucket", "model", "requests", "input_tokens", "cached_tokens", "output_tokens", "charged",
        "batch_requests", "batch_charged",
    ]  # fmt: skip
    assert [line[6] for line in lines[1:]] == ["0.666667", "0.005000"]
    assert [line[-1] for line in lines[1:]] == ["0.333334", "0.000000"]


async def test_usage_refuses_admin_keys(cp: ControlPlane) -> None:
    response = await cp.client.get("/v1/usage", headers=cp.admin)
    assert response.status_code == 403
