"""Reports over a real ledger on SQLite and PostgreSQL: exact totals, UTC buckets, scoping."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

import pytest
from report_factories import BASE, Row, add_models, add_tenants, insert_rows, random_rows, row

from hydrant.platform.auth.principal import CONSOLE, INFERENCE_SCOPE, Principal
from hydrant.platform.billing.money import round_money
from hydrant.platform.db.session import Database
from hydrant.platform.errors import NotFound
from hydrant.platform.reports.query import Bucket, ReportQuery, build_query
from hydrant.platform.reports.schemas import CostReportView
from hydrant.platform.reports.service import CostReport, ReportService

MODELS = ["alpha", "beta"]


def tenant_principal(tenant_id: str) -> Principal:
    return Principal(
        tenant_id=tenant_id, key_id="key_x", key_prefix="x", scopes=frozenset({INFERENCE_SCOPE})
    )


async def seed(db: Database, rows_of: int = 0) -> tuple[dict[str, str], dict[str, str], list[Row]]:
    async with db.session() as session:
        tenants = await add_tenants(session, ["acme", "globex"])
        models = await add_models(session, MODELS)
        rows = random_rows(list(tenants.values()), MODELS, rows_of) if rows_of else []
        await insert_rows(session, rows, models)
    return tenants, models, rows


async def report(db: Database, query: ReportQuery, principal: Principal = CONSOLE) -> CostReport:
    async with db.session() as session:
        return await ReportService(session).costs(principal, query)


def bucket_start(moment: datetime, unit: Bucket) -> datetime:
    moment = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if unit == "day" else moment


def expected_groups(rows: list[Row], unit: Bucket) -> dict[tuple[datetime, str, str], list[Row]]:
    groups: dict[tuple[datetime, str, str], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(bucket_start(r.finished_at, unit), r.tenant_id, r.model)].append(r)
    return groups


async def test_totals_and_rows_equal_the_ledger_exactly(db: Database) -> None:
    _, _, rows = await seed(db, rows_of=600)
    query = ReportQuery(since=BASE, until=BASE + timedelta(days=10), group_by="day")
    result = await report(db, query)

    charged = sum((r.charged for r in rows), Decimal(0))
    cost = sum((r.device_cost for r in rows), Decimal(0))
    assert result.totals.requests == 600
    assert result.totals.charged == charged
    assert result.totals.device_cost == cost
    assert result.totals.margin == charged - cost
    assert result.totals.device_seconds == sum((r.device_seconds for r in rows), Decimal(0))
    assert result.totals.input_tokens == sum(r.input_tokens for r in rows)
    assert result.totals.cached_tokens == sum(r.cached_tokens for r in rows)
    assert result.totals.output_tokens == sum(r.output_tokens for r in rows)

    groups = expected_groups(rows, "day")
    assert [(g.bucket, g.tenant_id, g.model) for g in result.rows] == sorted(groups)
    for group in result.rows:
        members = groups[(group.bucket, group.tenant_id, group.model)]
        assert group.requests == len(members)
        assert group.charged == sum((m.charged for m in members), Decimal(0))
        assert group.device_cost == sum((m.device_cost for m in members), Decimal(0))
        assert group.output_tokens == sum(m.output_tokens for m in members)

    totals = CostReportView.of(result).totals
    assert totals.charged == f"{charged:.6f}"
    assert totals.rounded.charged == f"{round_money(charged, 2):f}"
    assert totals.rounded.margin == f"{round_money(charged - cost, 2):f}"


async def test_hourly_buckets_match_python_grouping(db: Database) -> None:
    _, _, rows = await seed(db, rows_of=300)
    query = ReportQuery(since=BASE, until=BASE + timedelta(days=3), group_by="hour")
    result = await report(db, query)
    inside = [r for r in rows if r.finished_at < BASE + timedelta(days=3)]
    groups = expected_groups(inside, "hour")
    assert {(g.bucket, g.tenant_id, g.model): g.requests for g in result.rows} == {
        key: len(members) for key, members in groups.items()
    }
    assert result.totals.charged == sum((r.charged for r in inside), Decimal(0))


async def test_buckets_are_cut_at_utc_midnight_and_on_the_hour(db: Database) -> None:
    tenants, models, _ = await seed(db)
    acme = tenants["acme"]
    plus_two = timezone(timedelta(hours=2))
    entries = [
        row(
            acme, "alpha", datetime(2026, 3, 1, 23, 59, 59, 999999, tzinfo=UTC), "1", request_id="a"
        ),
        row(acme, "alpha", datetime(2026, 3, 2, 0, 0, tzinfo=UTC), "2", request_id="b"),
        # 01:30 at +02:00 is 23:30 UTC the day before.
        row(acme, "alpha", datetime(2026, 3, 2, 1, 30, tzinfo=plus_two), "4", request_id="c"),
    ]
    async with db.session() as session:
        await insert_rows(session, entries, models)
    by_day = await report(db, build_query(now=BASE, since="2026-03-01", until="2026-03-02"))
    assert [(g.bucket.day, g.charged) for g in by_day.rows] == [(1, Decimal(5)), (2, Decimal(2))]
    assert all(g.bucket.tzinfo is UTC for g in by_day.rows)
    by_hour = await report(
        db, build_query(now=BASE, since="2026-03-01", until="2026-03-02", group_by="hour")
    )
    assert [(g.bucket.hour, g.charged) for g in by_hour.rows] == [
        (23, Decimal(5)),
        (0, Decimal(2)),
    ]


async def test_period_is_half_open_and_filters_narrow_it(db: Database) -> None:
    tenants, models, _ = await seed(db)
    acme, globex = tenants["acme"], tenants["globex"]
    start = datetime(2026, 3, 5, tzinfo=UTC)
    entries = [
        row(acme, "alpha", start - timedelta(microseconds=1), "1", request_id="before"),
        row(acme, "alpha", start, "2", request_id="first"),
        row(globex, "beta", start + timedelta(hours=5), "4", request_id="other"),
        row(
            acme,
            "beta",
            start + timedelta(days=1) - timedelta(microseconds=1),
            "8",
            request_id="last",
        ),
        row(acme, "alpha", start + timedelta(days=1), "16", request_id="after"),
    ]
    async with db.session() as session:
        await insert_rows(session, entries, models)
    day = ReportQuery(since=start, until=start + timedelta(days=1))
    assert (await report(db, day)).totals.charged == Decimal(14)
    only_acme = ReportQuery(since=start, until=start + timedelta(days=1), tenant_id=acme)
    assert (await report(db, only_acme)).totals.charged == Decimal(10)
    only_beta = ReportQuery(since=start, until=start + timedelta(days=1), model="beta")
    assert (await report(db, only_beta)).totals.charged == Decimal(12)
    nothing = ReportQuery(since=start, until=start + timedelta(days=1), model="gamma")
    empty = await report(db, nothing)
    assert empty.rows == [] and empty.totals.charged == 0 and empty.totals.requests == 0


async def test_a_tenant_sees_only_its_own_rows_whatever_it_asks(db: Database) -> None:
    tenants, _, rows = await seed(db, rows_of=200)
    acme, globex = tenants["acme"], tenants["globex"]
    query = ReportQuery(since=BASE, until=BASE + timedelta(days=10))
    own = await report(db, query, tenant_principal(acme))
    assert own.rows and {g.tenant_id for g in own.rows} == {acme}
    assert own.totals.charged == sum((r.charged for r in rows if r.tenant_id == acme), Decimal(0))
    asking_for_other = ReportQuery(since=query.since, until=query.until, tenant_id=globex)
    assert (await report(db, asking_for_other, tenant_principal(acme))).rows == []
    keyless = Principal(tenant_id=None, key_id="k", key_prefix="k", scopes=frozenset())
    assert (await report(db, query, keyless)).rows == []


async def test_tenant_reference_by_id_or_name(db: Database) -> None:
    tenants, _, _ = await seed(db)
    async with db.session() as session:
        service = ReportService(session)
        assert await service.tenant_id_for(CONSOLE, "acme") == tenants["acme"]
        assert await service.tenant_id_for(CONSOLE, tenants["globex"]) == tenants["globex"]
        with pytest.raises(NotFound):
            await service.tenant_id_for(CONSOLE, "initech")
        with pytest.raises(NotFound):  # a tenant cannot even resolve another tenant's name
            await service.tenant_id_for(tenant_principal(tenants["acme"]), "globex")


async def test_an_upstream_models_device_cost_is_marked_an_estimate_in_json_and_csv(
    db: Database,
) -> None:
    """Rows of a model served by an upstream pool carry the mark; the others do not."""
    from hydrant.platform.reports.csv_export import cost_report_csv

    await seed(db, rows_of=40)
    query = ReportQuery(since=BASE, until=BASE + timedelta(days=10), group_by="day")
    async with db.session() as session:
        result = await ReportService(session, frozenset({"beta"})).costs(CONSOLE, query)
    view = CostReportView.of(result)
    assert {r.model for r in view.data} == {"alpha", "beta"}
    assert all(r.device_cost_estimated == (r.model == "beta") for r in view.data)
    lines = cost_report_csv(result).splitlines()
    header = lines[0].split(",")
    at, model_at = header.index("device_cost_estimated"), header.index("model")
    cells = [line.split(",") for line in lines[1:]]
    assert {(c[model_at], c[at]) for c in cells} == {("alpha", "False"), ("beta", "True")}
