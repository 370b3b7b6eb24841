"""The ledger through a PostgreSQL outage, against a real gateway process.

The gateway reaches PostgreSQL through a TCP proxy the test cuts in the middle
of steady load. What must hold: requests keep being served during the outage
(their keys are in the auth cache), every request that got a 200 has exactly
one ledger row once the database is back (the ones made during the outage
came through the spool), and replaying entries that are already in the
database adds nothing.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server
from sqlalchemy.engine import make_url
from tcp_proxy import TcpProxy

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database
from hydrant.platform.keys import generate_key
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.ledger.spool_codec import decode_record

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

MAX_REQUESTS = 300  # a bound, not a target: the load runs until both outages are over
CLIENTS = 4
CALLS_BETWEEN = 15  # responses before, between and after the two outages
OUTAGE_S = 4.0  # each outage, well inside the auth cache TTL below
CACHE_TTL_S = 10
BODY = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Say one word."}],
    "max_tokens": 2,
    "temperature": 0,
}


def asyncpg_dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg", "postgresql", 1)


async def ledger_ids(url: str, tenant_id: str) -> list[str]:
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        rows = await connection.fetch(
            "SELECT request_id FROM ledger_entries WHERE tenant_id = $1", tenant_id
        )
    finally:
        await connection.close()
    return [row["request_id"] for row in rows]


async def ledger_totals(url: str) -> tuple[int, Decimal]:
    connection = await asyncpg.connect(asyncpg_dsn(url))
    try:
        row = await connection.fetchrow(
            "SELECT count(*) AS n, coalesce(sum(charged), 0) AS charged FROM ledger_entries"
        )
    finally:
        await connection.close()
    return int(row["n"]), Decimal(row["charged"])


async def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


@dataclass
class Call:
    request_id: str | None
    status: int
    started_in: str | None  # the outage going on when it was sent, if any
    finished_in: str | None  # the outage going on when its response came, if any

    @property
    def overlapped(self) -> str | None:
        return self.started_in or self.finished_in


@dataclass
class Load:
    """Steady load from a few clients; `key` is read per request so the test can switch it."""

    client: httpx.AsyncClient
    key: str
    outage: str | None = None
    done: bool = False
    calls: list[Call] = field(default_factory=list)

    async def one(self, key: str) -> httpx.Response:
        return await self.client.post(
            "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
        )

    async def worker(self) -> None:
        while not self.done and len(self.calls) < MAX_REQUESTS:
            before = self.outage
            response = await self.one(self.key)
            after = self.outage
            request_id = response.headers.get("x-request-id")
            self.calls.append(Call(request_id, response.status_code, before, after))
            await asyncio.sleep(0.1)

    def served_while_down(self, outage: str) -> int:
        """Requests sent and answered within the outage (a 200 needs its ledger entry written)."""
        return sum(
            1
            for c in self.calls
            if c.started_in == outage and c.finished_in == outage and c.status == 200
        )

    async def responses(self, count: int) -> None:
        target = len(self.calls) + count
        assert await wait_for(lambda: len(self.calls) >= target, 60), "the load stalled"


@dataclass
class Outage:
    seconds: float = 0.0
    cold_key_status: int = 0
    cold_key_body: dict[str, Any] = field(default_factory=dict)


@pytest.fixture()
def direct_url(fresh_postgres_url: str) -> str:
    """The test's database, migrated directly (not through the proxy)."""
    migrate.upgrade(fresh_postgres_url)
    return fresh_postgres_url


@pytest.fixture()
def proxy(direct_url: str) -> Iterator[TcpProxy]:
    parsed = make_url(direct_url)
    with TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432) as running:
        yield running


@pytest.fixture()
def server(
    direct_url: str,
    proxy: TcpProxy,
    redis_url: str,
    demo_model_dir: Path,
    tmp_path: Path,
) -> Iterator[RunningServer]:
    proxied = make_url(direct_url).set(port=proxy.port).render_as_string(hide_password=False)
    env = {
        "HYDRANT_DATABASE_URL": proxied,
        "HYDRANT_REDIS_URL": redis_url,
        "HYDRANT_AUTO_MIGRATE": "false",
        "HYDRANT_SECRET_KEY": generate_key("test").secret,
        "HYDRANT_KEY_CACHE_TTL_S": str(CACHE_TTL_S),
    }
    data_dir = tmp_path / "gateway"
    data_dir.mkdir()
    with hydrant_server(data_dir, demo_model_dir, env=env) as running:
        yield running


async def outage(
    load: Load, proxy: TcpProxy, server: RunningServer, tenant_id: str, kind: str
) -> Outage:
    """One outage of `OUTAGE_S` under the running load: `cut` (refuse and reset) or `stall`."""
    result = Outage()
    # A key used just now stays in the auth cache through the outage (far shorter than the TTL).
    warm = await asyncio.to_thread(server.new_key, tenant_id)
    cold = await asyncio.to_thread(server.new_key, tenant_id) if kind == "cut" else None
    assert (await load.one(warm)).status_code == 200
    load.key = warm
    (proxy.pause if kind == "cut" else proxy.stall)()
    load.outage = kind
    started = time.monotonic()
    try:
        await asyncio.sleep(OUTAGE_S)
        if cold is not None:  # a key never used: not in the cache, so it cannot be verified now
            refused = await load.one(cold)
            result.cold_key_status = refused.status_code
            result.cold_key_body = refused.json()
    finally:
        result.seconds = time.monotonic() - started
        proxy.resume()
        load.outage = None
    return result


async def wait_for_rows(url: str, tenant_id: str, expected: set[str | None]) -> list[str]:
    deadline = time.monotonic() + 30  # the gateway replays its spool every 5 s
    while True:
        rows = await ledger_ids(url, tenant_id)
        if expected <= set(rows) or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.5)


async def test_ledger_survives_database_outages(
    server: RunningServer, proxy: TcpProxy, direct_url: str, tmp_path: Path
) -> None:
    tenant_id, secret = server.tenant_key("outage")
    spool = server.data_dir / "ledger.spool"
    spool_copy = tmp_path / "replayed-once.spool"
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        load = Load(client, secret)
        assert (await load.one(secret)).status_code == 200  # the first key's cache entry
        workers = [asyncio.create_task(load.worker()) for _ in range(CLIENTS)]
        try:
            await load.responses(CALLS_BETWEEN)
            cut = await outage(load, proxy, server, tenant_id, "cut")
            assert spool.stat().st_size > 0, "nothing was spooled during the outage"
            shutil.copyfile(spool, spool_copy)  # entries replayed once soon: replayed again below
            await load.responses(CALLS_BETWEEN)
            stall = await outage(load, proxy, server, tenant_id, "stall")
            await load.responses(CALLS_BETWEEN)
        finally:
            load.done = True
            await asyncio.gather(*workers)

    # Served throughout: nothing failed, and requests were answered while the database was away.
    assert max(cut.seconds, stall.seconds) < CACHE_TTL_S - 1
    assert [c.status for c in load.calls] == [200] * len(load.calls)
    assert load.served_while_down("cut") >= 1
    assert load.served_while_down("stall") >= 1
    assert proxy.refused > 0  # the gateway did try the database during the cut
    # A key the gateway could not verify during the cut was refused, with an OpenAI error body.
    assert cut.cold_key_status != 200
    assert set(cut.cold_key_body["error"]) >= {"message", "type", "code"}

    served = {c.request_id for c in load.calls}
    assert None not in served and len(served) == len(load.calls)
    rows = await wait_for_rows(direct_url, tenant_id, served)
    # Exactly once: every 200 has its row, no row twice, no row for anything else
    # (the first and the two warm-up requests are this tenant's too).
    assert len(rows) == len(set(rows))
    assert served <= set(rows), f"{len(served - set(rows))} served requests have no entry"
    assert len(rows) == len(served) + 3
    assert await wait_for(lambda: spool.stat().st_size == 0, 10)
    assert not spool.with_name("ledger.spool.corrupt").exists()

    # The entries of the cut came from the spool: the copy holds them.
    copied = [
        decode_record(line)["request_id"] for line in spool_copy.read_bytes().splitlines(True)
    ]
    overlapped_cut = {c.request_id for c in load.calls if c.overlapped == "cut"}
    assert copied and set(copied) <= set(rows)
    assert set(copied) & overlapped_cut
    assert "ledger database unreachable" in server.log_file.read_text(errors="replace")

    await replay_twice_adds_nothing(direct_url, spool_copy, len(copied))


async def replay_twice_adds_nothing(direct_url: str, spool_copy: Path, entries: int) -> None:
    """Entries already in the database replayed again (twice): no row added or changed."""
    before = await ledger_totals(direct_url)
    original = spool_copy.read_bytes()
    database = Database(direct_url)
    try:
        for _ in range(2):
            spool_copy.write_bytes(original)
            with LedgerSpool(spool_copy) as spool:
                ledger = DatabaseLedger(database, spool, DevicePrice(Decimal("1.00")))
                assert spool.pending() == entries
                assert await ledger.replay_spool() == entries
                assert spool.pending() == 0
            assert await ledger_totals(direct_url) == before
    finally:
        await database.dispose()
