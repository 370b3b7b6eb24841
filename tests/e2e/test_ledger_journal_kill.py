"""Journal mode (`HYDRANT_LEDGER_COMMIT=journal`) through a SIGKILL of the gateway.

In journal mode a 200 waits for its entry to be fsync'd in the local journal,
not for PostgreSQL; a background mover copies entries into the database. Here
the database is cut (through a TCP proxy) so entries pile up in the journal,
the gateway is killed with SIGKILL, the database comes back and a new gateway
on the same data folder replays the journal: every request that got a 200 has
exactly one ledger row, and the journal ends empty.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fault_load import Tally, gateway_env, steady_load, until
from hydrant_server import hydrant_server
from sqlalchemy.engine import make_url
from tcp_proxy import TcpProxy
from test_ledger_faults import BODY, ledger_ids, wait_for, wait_for_rows

from hydrant.platform.db import migrate
from hydrant.platform.keys import generate_key
from hydrant.platform.ledger.spool_codec import decode_record

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture()
def direct_url(fresh_postgres_url: str) -> str:
    migrate.upgrade(fresh_postgres_url)
    return fresh_postgres_url


@pytest.fixture()
def proxy(direct_url: str) -> Iterator[TcpProxy]:
    parsed = make_url(direct_url)
    with TcpProxy(parsed.host or "127.0.0.1", parsed.port or 5432) as running:
        yield running


async def test_journal_replays_exactly_once_after_sigkill(
    direct_url: str, proxy: TcpProxy, demo_model_dir: Path, tmp_path: Path
) -> None:
    proxied = make_url(direct_url).set(port=proxy.port).render_as_string(hide_password=False)
    admin_key = generate_key("test").secret
    env = gateway_env(proxied, HYDRANT_LEDGER_COMMIT="journal")
    tally = Tally()
    with hydrant_server(tmp_path, demo_model_dir, env=env, admin_key=admin_key) as server:
        tenant_id, key = server.tenant_key("journal")
        journal = server.data_dir / "ledger.spool"
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            headers = {"Authorization": f"Bearer {key}"}
            warm_up = await client.post("/v1/chat/completions", json=BODY, headers=headers)
            assert warm_up.status_code == 200
            # The mover keeps up while the database answers: the warm-up's row appears.
            moved = warm_up.headers["x-request-id"]
            for _ in range(100):
                if moved in await ledger_ids(direct_url, tenant_id):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the journal's mover did not reach the database")
            clients = [asyncio.create_task(steady_load(client, key, tally)) for _ in range(3)]
            try:
                await until(tally, "before", 6)
                proxy.pause()  # the database is unreachable: entries stay in the journal
                tally.phase = "down"
                await until(tally, "down", 8)
                # The mover notices the outage when its write times out; on a fast host the
                # 8 requests are served before that (session 52), so the kill waits for its
                # log line while the load goes on.
                noticed = "ledger journal cannot reach the database"
                assert await wait_for(
                    lambda: noticed in server.log_file.read_text(errors="replace"), 60
                ), "the journal's mover never noticed the database was cut"
                tally.phase = "killed"
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(timeout=10)
                await until(tally, "killed", 3)
            finally:
                tally.done = True
                await asyncio.gather(*clients)
    assert server.process.returncode == -signal.SIGKILL
    lines = journal.read_bytes().splitlines(True)
    journaled = [decode_record(line)["request_id"] for line in lines]
    served = tally.ok_ids()
    assert tally.count("down", 200) >= 8, "requests were not served with the database cut"
    assert journaled, "nothing was waiting in the journal when the gateway was killed"
    assert not set(journaled) & set(await ledger_ids(direct_url, tenant_id))
    log = server.log_file.read_text(errors="replace")
    assert "ledger journal cannot reach the database" in log  # the journal's mover, not
    assert "ledger database unreachable: spooling entries" not in log  # database mode's path

    proxy.resume()
    with hydrant_server(tmp_path, demo_model_dir, env=env, admin_key=admin_key) as restarted:
        rows = await wait_for_rows(direct_url, tenant_id, served)
        assert await wait_for(lambda: journal.stat().st_size == 0, 15), "journal not replayed"
        restarted_log = restarted.log_file.read_text(errors="replace")
        assert "ledger journal holds entries of a previous run" in restarted_log
    assert len(rows) == len(set(rows)), "a request was counted twice"
    assert served <= set(rows), f"{len(served - set(rows))} requests that got a 200 have no entry"
    assert set(journaled) <= set(rows)
    # Besides the 200s and the warm-up, only requests cut by the kill may have a row.
    assert len(rows) - len(served) - 1 <= tally.count("killed", 0) + tally.count("down", 0)
