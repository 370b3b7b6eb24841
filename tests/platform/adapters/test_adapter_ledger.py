"""The ledger entry of an adapter's request: the base model's row, the adapter named, priced at
the adapter's own version when it has one and the base model's otherwise, live and replayed
from the spool alike (on both databases: PostgreSQL writes through its own insert); reports
and rollups give each adapter its own line, `base:adapter`."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from sqlalchemy import select

from hydrant.engine.protocol import RequestUsage, Sampling
from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import (
    LedgerEntry,
    LedgerHourlyRollup,
    ModelDeployment,
    Price,
    Tenant,
)
from hydrant.platform.db.session import Database
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.quotas.admission import RequestContext
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.repository import aggregate
from hydrant.platform.reports.rollups import rollup_hours

EPOCH = datetime(2020, 1, 1, tzinfo=UTC)
OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(
        prompt_tokens=1_000_000, cached_tokens=0, completion_tokens=1_000_000, device_ns=0
    ),
    finished_at=utcnow(),
)


def _ctx(request_id: str, adapter: str | None) -> RequestContext:
    return RequestContext(
        request_id=request_id,
        tenant_id="ten_a",
        api_key_id=None,
        key_prefix="hyd_test_x",
        model="demo",
        prepared=PreparedRequest.single([1, 2, 3], Sampling(max_tokens=4)),
        adapter=adapter,
    )


def _price(model_id: str, input_price: str, output_price: str) -> Price:
    return Price(
        id=f"prc_{model_id}",
        model_id=model_id,
        effective_from=EPOCH,
        input_per_mtok=Decimal(input_price),
        cached_input_per_mtok=Decimal(input_price),
        output_per_mtok=Decimal(output_price),
    )


async def test_adapter_entries_name_it_and_use_its_price(database_url: str, tmp_path: Path) -> None:
    database = Database(database_url)
    try:
        async with database.session() as session:
            session.add(Tenant(id="ten_a", name="a"))
            for model_id, name in (("mdl_demo", "demo"), ("mdl_sql", "demo:sql")):
                session.add(ModelDeployment(id=model_id, name=name, path="/m"))
            session.add(ModelDeployment(id="mdl_chat", name="demo:chat", path="/m"))
            await session.flush()
            session.add(_price("mdl_demo", "1", "2"))
            session.add(_price("mdl_sql", "5", "7"))  # `demo:chat` has none of its own
        spool = LedgerSpool(tmp_path / "ledger.spool")
        ledger = DatabaseLedger(database, spool, DevicePrice(Decimal("1")))
        await ledger.record(_ctx("r_base", None), OUTCOME)
        await ledger.record(_ctx("r_sql", "sql"), OUTCOME)
        await ledger.record(_ctx("r_chat", "chat"), OUTCOME)
        # An entry spooled while the database was away keeps its adapter through replay.
        spool.append(ledger._spool_entry(_ctx("r_spooled", "sql"), dataclasses.replace(OUTCOME)))
        assert await ledger.replay_spool() == 1
        spool.close()
        async with database.session() as session:
            rows = {
                e.request_id: (e.model_id, e.adapter, e.price_id, e.charged)
                for e in await session.scalars(select(LedgerEntry))
            }
        assert rows == {
            "r_base": ("mdl_demo", None, "prc_mdl_demo", Decimal("3.000000")),
            "r_sql": ("mdl_demo", "sql", "prc_mdl_sql", Decimal("12.000000")),
            "r_chat": ("mdl_demo", "chat", "prc_mdl_demo", Decimal("3.000000")),
            "r_spooled": ("mdl_demo", "sql", "prc_mdl_sql", Decimal("12.000000")),
        }
        # Reports and the hourly rollups group by model, an adapter's requests on its own line.
        since, until = OUTCOME.finished_at - timedelta(days=1), utcnow() + timedelta(hours=1)
        async with database.session() as session:
            lines = await aggregate(session, CONSOLE, ReportQuery(since=since, until=until))
            only = await aggregate(
                session, CONSOLE, ReportQuery(since=since, until=until, model="demo:sql")
            )
        assert {(r.model, r.requests, r.charged) for r in lines} == {
            ("demo", 1, Decimal("3.000000")),
            ("demo:chat", 1, Decimal("3.000000")),
            ("demo:sql", 2, Decimal("24.000000")),
        }
        assert [(r.model, r.requests) for r in only] == [("demo:sql", 2)]
        assert await rollup_hours(database, since, until) > 0
        async with database.session() as session:
            rolled = {
                (r.model, r.requests) for r in await session.scalars(select(LedgerHourlyRollup))
            }
        assert rolled == {("demo", 1), ("demo:chat", 1), ("demo:sql", 2)}
    finally:
        await database.dispose()
