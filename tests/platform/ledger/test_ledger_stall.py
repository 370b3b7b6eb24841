"""The database-mode ledger through a stalled PostgreSQL (a partition: no refusal, no answer).

What must hold: the first write to time out goes to the spool, and so does
every write after it without trying the database again (no request pays the
write timeout twice in one stall); pings in the background end the stall once
the database answers, live writes resume, and replay brings the spooled
entries in exactly once. The database is real; the stall is a TCP proxy that
holds every byte (tests/e2e/tcp_proxy.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from ledger_requests import request_context
from sqlalchemy import select
from sqlalchemy.engine import make_url
from tcp_proxy import TcpProxy

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.billing.pricing import Price
from hydrant.platform.db import migrate
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.models.deployments import ensure_deployments
from hydrant.platform.quotas.admission import RequestContext
from hydrant.settings import ModelSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WRITE_TIMEOUT_S = 0.5
OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(prompt_tokens=10, cached_tokens=0, completion_tokens=5, device_ns=1_000),
    finished_at=utcnow(),
)


def _ctx(request_id: str) -> RequestContext:
    return request_context(request_id, "ten_stall")


@pytest.fixture()
def proxy(fresh_postgres_url: str) -> Iterator[TcpProxy]:
    migrate.upgrade(fresh_postgres_url)
    parsed = make_url(fresh_postgres_url)
    with TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432) as running:
        yield running


@pytest.fixture()
async def database(fresh_postgres_url: str, proxy: TcpProxy) -> AsyncIterator[Database]:
    direct = Database(fresh_postgres_url)
    async with direct.session() as session:
        session.add(Tenant(id="ten_stall", name="stall"))
    await ensure_deployments(
        direct,
        [ModelSpec("demo", Path("/models/demo"))],
        Price(input_per_million=Decimal("1"), output_per_million=Decimal("2")),
    )
    await direct.dispose()
    proxied = make_url(fresh_postgres_url).set(port=proxy.port)
    database = Database(proxied.render_as_string(hide_password=False))
    yield database
    proxy.resume()
    await database.dispose()


async def _rows(url: str) -> list[str]:
    database = Database(url)
    try:
        async with database.session() as session:
            return sorted(await session.scalars(select(LedgerEntry.request_id)))
    finally:
        await database.dispose()


async def test_a_stall_costs_one_timed_out_write_and_live_writes_resume(
    database: Database, proxy: TcpProxy, fresh_postgres_url: str, tmp_path: Path
) -> None:
    ledger = DatabaseLedger(
        database,
        LedgerSpool(tmp_path / "ledger.spool"),
        DevicePrice(Decimal(2)),
        write_timeout_s=WRITE_TIMEOUT_S,
    )
    await ledger.record(_ctx("req_before"), OUTCOME)
    assert await _rows(fresh_postgres_url) == ["req_before"]

    proxy.stall()
    await ledger.record(_ctx("req_first"), OUTCOME)  # waits out the timeout, then spooled
    assert ledger.spool.pending() == 1
    assert len(ledger._slow_writes) == 1
    # The rest of the stall: spooled at once, none of them tries the database.
    await asyncio.gather(*(ledger.record(_ctx(f"req_during_{i}"), OUTCOME) for i in range(8)))
    assert ledger.spool.pending() == 9
    assert len(ledger._slow_writes) == 1  # still only the first write is waiting on it

    proxy.resume()
    deadline = time.monotonic() + 30
    number = 0
    while ledger._stalled:  # each record while stalled may send a ping; one answers
        assert time.monotonic() < deadline, "no ping ended the stall"
        await ledger.record(_ctx(f"req_probe_{number}"), OUTCOME)
        number += 1
        await asyncio.sleep(0.1)
    spooled = ledger.spool.pending()
    await ledger.record(_ctx("req_after"), OUTCOME)  # live again: straight into the table
    assert ledger.spool.pending() == spooled
    assert "req_after" in await _rows(fresh_postgres_url)

    # Replay brings in every spooled entry once; the timed-out write may have landed
    # on its own when the bytes flowed again, and is not counted twice.
    await ledger.replay_spool()
    await ledger.replay_spool()
    expected = {"req_before", "req_first", "req_after"}
    expected |= {f"req_during_{i}" for i in range(8)} | {f"req_probe_{i}" for i in range(number)}
    rows = await _rows(fresh_postgres_url)
    assert sorted(rows) == sorted(expected)
    ledger.spool.close()
