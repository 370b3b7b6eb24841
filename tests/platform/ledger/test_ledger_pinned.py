"""The PostgreSQL live path (`ledger/pinned.py`): one statement on a kept connection.

What must hold, as on the session path: the row written is the same row
(priced, exact decimals), once per request id; a refused row is refused the
same way; a dead connection costs one write (spooled, not lost) and the next
write lands on a fresh one; the connection goes back to the pool at dispose.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from ledger_requests import request_context
from sqlalchemy import Table, select

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.billing.pricing import Price
from hydrant.platform.db import migrate
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.ledger import repository
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.models.deployments import ensure_deployments
from hydrant.platform.quotas.admission import RequestContext
from hydrant.settings import ModelSpec

pytestmark = pytest.mark.integration

OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(
        prompt_tokens=1234, cached_tokens=200, completion_tokens=567, device_ns=123_456_789
    ),
    finished_at=utcnow(),
)
PRICE = Price(
    input_per_million=Decimal("0.15"),
    output_per_million=Decimal("0.60"),
    cached_input_per_million=Decimal("0.075"),
)


def _ctx(request_id: str, tenant_id: str = "ten_pin") -> RequestContext:
    return request_context(request_id, tenant_id)


@pytest.fixture()
async def database(fresh_postgres_url: str) -> AsyncIterator[Database]:
    await asyncio.to_thread(migrate.upgrade, fresh_postgres_url)
    database = Database(fresh_postgres_url)
    async with database.session() as session:
        session.add(Tenant(id="ten_pin", name="pinned"))
    await ensure_deployments(database, [ModelSpec("demo", Path("/models/demo"))], PRICE)
    yield database
    await database.dispose()


def _ledger(database: Database, tmp_path: Path) -> DatabaseLedger:
    return DatabaseLedger(database, LedgerSpool(tmp_path / "ledger.spool"), DevicePrice(Decimal(2)))


async def _rows(database: Database) -> dict[str, dict[str, Any]]:
    async with database.session() as session:
        entries = await session.scalars(select(LedgerEntry))
        return {
            e.request_id: {
                c: getattr(e, c) for c in repository.PG_COLUMNS if c not in ("recorded_at",)
            }
            for e in entries
        }


def test_the_statement_names_every_column_of_the_table() -> None:
    table = cast(Table, LedgerEntry.__table__)
    assert sorted(repository.PG_COLUMNS) == sorted(c.name for c in table.columns)


async def test_the_pinned_row_is_the_session_row(database: Database, tmp_path: Path) -> None:
    ledger = _ledger(database, tmp_path)
    assert ledger._pinned is not None
    ctx = _ctx("req_pinned")
    await ledger.record(ctx, OUTCOME)
    assert ledger._pinned._connection is not None  # it went the pinned way
    # The same entry through the session path (as a replay would write it).
    raw = ledger._spool_entry(replace(ctx, request_id="req_session"), OUTCOME)
    async with database.session() as session:
        await repository.insert_if_absent(session, [await ledger.price_entry(session, raw)])
    rows = await _rows(database)
    pinned, session_row = rows["req_pinned"], rows["req_session"]
    assert {k: v for k, v in pinned.items() if k != "request_id"} == {
        k: v for k, v in session_row.items() if k != "request_id"
    }
    # 1034 input at 0.15, 200 cached at 0.075, 567 output at 0.60 per million tokens
    assert pinned["charged"] == Decimal("0.000510")
    assert pinned["price_id"] is not None
    assert pinned["device_seconds"] == Decimal("0.123456789")
    # Again, live and in a batch with a new one: nothing twice.
    await asyncio.gather(
        ledger.record(_ctx("req_pinned"), OUTCOME), ledger.record(_ctx("req_new"), OUTCOME)
    )
    assert sorted(await _rows(database)) == ["req_new", "req_pinned", "req_session"]


async def test_a_dead_connection_costs_one_spooled_write(
    database: Database, tmp_path: Path
) -> None:
    ledger = _ledger(database, tmp_path)
    assert ledger._pinned is not None
    await ledger.record(_ctx("req_before"), OUTCOME)
    connection = ledger._pinned._connection
    assert connection is not None
    raw = await connection.get_raw_connection()
    pid = raw.driver_connection.get_server_pid()
    killer = await asyncpg.connect(database.url.replace("postgresql+asyncpg", "postgresql"))
    try:
        assert await killer.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await killer.close()
    await ledger.record(_ctx("req_during"), OUTCOME)  # the dead link: into the spool
    assert ledger.spool.pending() == 1
    await ledger.record(_ctx("req_after"), OUTCOME)  # a fresh connection: straight in
    assert ledger._pinned._connection is not None
    assert ledger._pinned._connection is not connection
    assert sorted(await _rows(database)) == ["req_after", "req_before"]
    assert await ledger.replay_spool() == 1
    assert sorted(await _rows(database)) == ["req_after", "req_before", "req_during"]
    ledger.spool.close()


async def test_while_busy_writes_take_the_session_path(database: Database, tmp_path: Path) -> None:
    ledger = _ledger(database, tmp_path)
    assert ledger._pinned is not None
    ledger._pinned._busy = True  # as while a replay holds it
    await ledger.record(_ctx("req_busy"), OUTCOME)
    assert ledger._pinned._connection is None  # never opened
    ledger._pinned._busy = False
    assert list(await _rows(database)) == ["req_busy"]


async def test_dispose_gives_the_connection_back(fresh_postgres_url: str, tmp_path: Path) -> None:
    await asyncio.to_thread(migrate.upgrade, fresh_postgres_url)
    database = Database(fresh_postgres_url)
    async with database.session() as session:
        session.add(Tenant(id="ten_pin", name="pinned"))
    ledger = _ledger(database, tmp_path)
    await ledger.record(_ctx("req_one"), OUTCOME)
    assert database.engine.pool.checkedout() == 1
    await database.dispose()
    assert database.engine.pool.checkedout() == 0
    assert ledger._pinned is not None and not ledger._pinned.available
    # After dispose the pool can still be used; the ledger writes the session way.
    await ledger.record(_ctx("req_two"), OUTCOME)
    assert sorted(await _rows(database)) == ["req_one", "req_two"]
    assert database.engine.pool.checkedout() == 0
    ledger.spool.close()
    await database.dispose()
