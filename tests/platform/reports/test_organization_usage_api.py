"""OpenAI's organization usage and costs API (`/v1/organization/...`) through the real app,
on each backend: sums equal the ledger's rows exactly, buckets are cut on the UTC grid,
group_by and filters, pagination that neither loses nor repeats a bucket, admin keys only."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import openai
from control_plane_helpers import ControlPlane, bearer
from report_factories import BASE, Row, add_models, add_tenants, insert_rows, random_rows, row
from sqlalchemy import update

from hydrant.platform.db.models import LedgerEntry
from hydrant.platform.services import services_of

DAY = datetime(2026, 3, 5, tzinfo=UTC)


def unix(moment: datetime) -> int:
    return int(moment.timestamp())


async def write(cp: ControlPlane, entries: list[Row], models: list[str]) -> None:
    async def run() -> None:
        async with services_of(cp.app).database.session() as session:
            ids = await add_models(session, models)
            await insert_rows(session, entries, ids)

    await cp.in_app(run)


async def get(cp: ControlPlane, path: str, **params: Any) -> dict[str, Any]:
    response = await cp.client.get(f"/v1/organization/{path}", params=params, headers=cp.admin)
    assert response.status_code == 200, response.text
    # parse_float=Decimal: the amounts are checked exactly as written, not as floats
    return dict(json.loads(response.text, parse_float=Decimal))


async def seed(cp: ControlPlane) -> tuple[str, str, str, list[Row]]:
    acme, _ = await cp.tenant_with_key("acme")
    globex, _ = await cp.tenant_with_key("globex")
    key, _ = await cp.create_key(acme["id"], name="backend")
    entries = [
        row(acme["id"], "alpha", DAY, "0.333333", request_id="r1", tokens=(100, 40, 7)),
        row(acme["id"], "alpha", DAY + timedelta(hours=5), "0.333334", request_id="r2",
            batch_id="batch_1"),
        row(acme["id"], "beta", DAY + timedelta(hours=23, minutes=59, seconds=59,
            microseconds=999_999), "0.005", request_id="r3", tokens=(1, 0, 1)),
        row(globex["id"], "beta", DAY + timedelta(days=1), "12345.678901", request_id="r4"),
        row(acme["id"], "alpha", DAY - timedelta(microseconds=1), "7", request_id="r0"),
    ]  # fmt: skip
    await write(cp, entries, ["alpha", "beta"])

    async def key_the_first() -> None:  # r1 was made with the `backend` key
        async with services_of(cp.app).database.session() as session:
            await session.execute(
                update(LedgerEntry)
                .where(LedgerEntry.request_id == "r1")
                .values(api_key_id=key["id"])
            )

    await cp.in_app(key_the_first)
    return acme["id"], globex["id"], key["id"], entries


async def test_usage_by_day_on_the_utc_grid_with_groups_and_filters(cp: ControlPlane) -> None:
    acme, globex, key_id, _ = await seed(cp)
    page = await get(
        cp, "usage/completions", start_time=unix(DAY), end_time=unix(DAY + timedelta(days=2))
    )
    assert page["object"] == "page" and page["has_more"] is False and page["next_page"] is None
    day1, day2 = page["data"]
    assert (day1["start_time"], day1["end_time"]) == (unix(DAY), unix(DAY + timedelta(days=1)))
    [total] = day1["results"]  # r0 is a microsecond before the range; r4 starts day 2
    assert total["object"] == "organization.usage.completions.result"
    assert (total["num_model_requests"], total["input_tokens"], total["input_cached_tokens"],
            total["output_tokens"]) == (3, 111, 40, 13)  # fmt: skip
    assert total["model"] is None and total["project_id"] is None
    assert day2["results"][0]["num_model_requests"] == 1

    grouped = await get(
        cp,
        "usage/completions",
        start_time=unix(DAY),
        end_time=unix(DAY + timedelta(days=2)),
        group_by=["model", "project_id"],
    )
    first = {
        (r["model"], r["project_id"]): r["num_model_requests"]
        for r in grouped["data"][0]["results"]
    }
    assert first == {("alpha", acme): 2, ("beta", acme): 1}
    assert [(r["model"], r["project_id"]) for r in grouped["data"][1]["results"]] == [
        ("beta", globex)
    ]
    by_key = await get(
        cp, "usage/completions", start_time=unix(DAY), group_by="api_key_id,batch",
        end_time=unix(DAY + timedelta(days=1)),
    )  # fmt: skip
    keyed = {
        (r["api_key_id"], r["batch"]): r["num_model_requests"] for r in by_key["data"][0]["results"]
    }
    assert keyed == {(key_id, False): 1, (None, True): 1, (None, False): 1}

    filtered = await get(
        cp, "usage/completions", start_time=unix(DAY), end_time=unix(DAY + timedelta(days=2)),
        models="beta", project_ids=globex,
    )  # fmt: skip
    assert filtered["data"][0]["results"] == []
    assert filtered["data"][1]["results"][0]["num_model_requests"] == 1
    only_key = await get(
        cp, "usage/completions", start_time=unix(DAY), api_key_ids=key_id,
        end_time=unix(DAY + timedelta(days=2)),
    )  # fmt: skip
    assert only_key["data"][0]["results"][0]["input_tokens"] == 100
    assert only_key["data"][1]["results"] == []

    # a start inside a day: that day's bucket, holding only what is after the start
    late = await get(
        cp, "usage/completions", start_time=unix(DAY + timedelta(hours=4)),
        end_time=unix(DAY + timedelta(days=1)),
    )  # fmt: skip
    [bucket] = late["data"]
    assert bucket["start_time"] == unix(DAY) and bucket["results"][0]["num_model_requests"] == 2

    minutes = await get(
        cp, "usage/completions", start_time=unix(DAY + timedelta(hours=5)), bucket_width="1m",
        end_time=unix(DAY + timedelta(hours=5, minutes=3)),
    )  # fmt: skip
    assert [len(b["results"]) for b in minutes["data"]] == [1, 0, 0]


async def test_costs_equal_the_ledger_exactly(cp: ControlPlane) -> None:
    _, _, _, entries = await seed(cp)
    page = await get(cp, "costs", start_time=unix(DAY), end_time=unix(DAY + timedelta(days=2)))
    [[day1], [day2]] = [b["results"] for b in page["data"]]
    assert day1["object"] == "organization.costs.result"
    assert day1["amount"] == {"value": Decimal("0.671667"), "currency": "usd"}
    assert day2["amount"]["value"] == Decimal("12345.678901")
    lines = await get(
        cp, "costs", start_time=unix(DAY - timedelta(days=1)), group_by=["line_item", "project_id"],
        end_time=unix(DAY + timedelta(days=2)),
    )  # fmt: skip
    got = {
        (b["start_time"], r["line_item"], r["project_id"]): r["amount"]["value"]
        for b in lines["data"]
        for r in b["results"]
    }
    want: dict[tuple[int, str, str], Decimal] = defaultdict(Decimal)
    for e in entries:
        start = unix(e.finished_at.replace(hour=0, minute=0, second=0, microsecond=0))
        want[(start, e.model, e.tenant_id)] += e.charged
    assert got == want
    bad = await cp.client.get(
        "/v1/organization/costs",
        params={"start_time": unix(DAY), "bucket_width": "1h"},
        headers=cp.admin,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "bucket_width"


async def test_pages_visit_every_bucket_once_and_sum_to_the_ledger(cp: ControlPlane) -> None:
    async def tenants() -> dict[str, str]:
        async with services_of(cp.app).database.session() as session:
            return await add_tenants(session, ["t1", "t2"])

    ids = await cp.in_app(tenants)
    entries = random_rows(list(ids.values()), ["alpha", "beta"], 300)
    await write(cp, entries, ["alpha", "beta"])
    start, end = unix(BASE) + 1800, unix(BASE + timedelta(days=10))  # not on the hour grid
    seen: list[int] = []
    requests = tokens = 0
    charged = Decimal(0)
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, Any] = {"start_time": start, "end_time": end, "bucket_width": "1h",
                                  "limit": 50, "group_by": "model"}  # fmt: skip
        if cursor:
            params["page"] = cursor
        usage = await get(cp, "usage/completions", **params)
        pages += 1
        seen += [b["start_time"] for b in usage["data"]]
        for b in usage["data"]:
            assert b["end_time"] - b["start_time"] == 3600 and b["start_time"] % 3600 == 0
            requests += sum(r["num_model_requests"] for r in b["results"])
            tokens += sum(r["output_tokens"] for r in b["results"])
        if not usage["has_more"]:
            assert usage["next_page"] is None
            break
        cursor = usage["next_page"]
    assert pages == 5  # 240 hourly buckets, 50 a page
    assert seen == list(range(unix(BASE), end, 3600))  # none lost, none repeated
    inside = [e for e in entries if start <= e.finished_at.timestamp() < end]
    assert requests == len(inside) and tokens == sum(e.output_tokens for e in inside)

    cursor = None
    days = 0
    while True:
        params = {"start_time": start, "end_time": end, "limit": 3}
        if cursor:
            params["page"] = cursor
        costs = await get(cp, "costs", **params)
        days += len(costs["data"])
        charged += sum(
            (r["amount"]["value"] for b in costs["data"] for r in b["results"]), Decimal(0)
        )
        if not costs["has_more"]:
            break
        cursor = costs["next_page"]
    assert days == 10 and charged == sum((e.charged for e in inside), Decimal(0))


async def test_admin_keys_only_and_openai_errors(cp: ControlPlane) -> None:
    _, secret = await cp.tenant_with_key("acme")
    path = "/v1/organization/usage/completions"
    tenant = await cp.client.get(path, params={"start_time": 0}, headers=bearer(secret))
    assert tenant.status_code == 403
    assert tenant.json()["error"]["code"] == "insufficient_scope"
    assert (await cp.client.get(path, params={"start_time": 0})).status_code == 401
    for params, param in (
        ({}, "start_time"),
        ({"start_time": "soon"}, "start_time"),
        ({"start_time": 100, "end_time": 50}, "end_time"),
        ({"start_time": 0, "end_time": 86400 * 40, "limit": 32}, "limit"),
        ({"start_time": 0, "group_by": "user"}, "group_by"),  # OpenAI's name is user_id
        ({"start_time": 0, "page": "page_bogus!"}, "page"),
        ({"start_time": 0, "bucket_width": "1w"}, "bucket_width"),
    ):
        bad = await cp.client.get(path, params=params, headers=cp.admin)
        assert bad.status_code == 400, (params, bad.text)
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param


async def test_the_official_openai_client_reads_them(cp: ControlPlane) -> None:
    _, _, _, entries = await seed(cp)
    client = openai.AsyncOpenAI(
        api_key=cp.admin_secret, base_url=f"{cp.client.base_url}/v1", http_client=cp.client
    )
    params = {"start_time": unix(DAY), "end_time": unix(DAY + timedelta(days=2)),
              "group_by": ["model"]}  # fmt: skip
    usage: Any = await client.get(
        "/organization/usage/completions", cast_to=object, options={"params": params}
    )
    assert sum(r["num_model_requests"] for b in usage["data"] for r in b["results"]) == 4
    params["group_by"] = ["line_item"]
    costs: Any = await client.get("/organization/costs", cast_to=object, options={"params": params})
    assert {r["line_item"] for b in costs["data"] for r in b["results"]} == {"alpha", "beta"}
    total = sum(Decimal(str(r["amount"]["value"])) for b in costs["data"] for r in b["results"])
    assert total == sum((e.charged for e in entries if e.request_id != "r0"), Decimal(0))
    try:
        await openai.AsyncOpenAI(
            api_key="hyd_wrong", base_url=f"{cp.client.base_url}/v1", http_client=cp.client,
            max_retries=0,
        ).get("/organization/costs", cast_to=object, options={"params": params})  # fmt: skip
    except openai.AuthenticationError as exc:
        assert exc.status_code == 401
    else:
        raise AssertionError("a wrong key was accepted")
