"""The gateway killed with SIGKILL under load, with entries in its spool.

The database is stopped first, so the gateway is spooling when it dies (an
entry that went straight to the database proves nothing about the spool).
After the kill the spool file is still on disk; the database comes back and a
new gateway on the same data folder replays it: every request that got a 200
has exactly one ledger row. Requests cut by the kill got no answer; their rows
may or may not exist, but none exists twice and none exists for a request
never sent.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
import pytest
from fault_load import Tally, gateway_env, private_pg, steady_load, until
from hydrant_server import hydrant_server
from private_services import PrivatePostgres
from test_ledger_faults import BODY, wait_for, wait_for_rows

from hydrant.platform.keys import generate_key
from hydrant.platform.ledger.spool_codec import decode_record

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
__all__ = ["private_pg"]  # a fixture, used by name


async def test_spool_replays_after_sigkill(
    private_pg: PrivatePostgres, demo_model_dir: Path, tmp_path: Path
) -> None:
    admin_key = generate_key("test").secret
    env = gateway_env(private_pg.url)
    tally = Tally()
    with hydrant_server(tmp_path, demo_model_dir, env=env, admin_key=admin_key) as server:
        tenant_id, key = server.tenant_key("sigkill")
        spool = server.data_dir / "ledger.spool"
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            headers = {"Authorization": f"Bearer {key}"}
            warm_up = await client.post("/v1/chat/completions", json=BODY, headers=headers)
            assert warm_up.status_code == 200
            clients = [asyncio.create_task(steady_load(client, key, tally)) for _ in range(3)]
            try:
                await until(tally, "before", 6)
                await asyncio.to_thread(private_pg.stop)
                tally.phase = "down"
                await until(tally, "down", 8)
                tally.phase = "killed"
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(timeout=10)
                await until(tally, "killed", 3)  # the clients saw the gateway go
            finally:
                tally.done = True
                await asyncio.gather(*clients)
    assert server.process.returncode == -signal.SIGKILL
    spooled = [decode_record(line)["request_id"] for line in spool.read_bytes().splitlines(True)]
    assert spooled, "the gateway was not spooling when it was killed"
    served = tally.ok_ids()
    assert tally.count("down", 200) >= 8
    assert tally.count(status=0) >= 1  # requests the kill cut off

    await asyncio.to_thread(private_pg.start)
    with hydrant_server(tmp_path, demo_model_dir, env=env, admin_key=admin_key) as restarted:
        rows = await wait_for_rows(private_pg.url, tenant_id, served)
        assert await wait_for(lambda: spool.stat().st_size == 0, 15), "the spool was not replayed"
        assert "spooled ledger entries replayed" in restarted.log_file.read_text(errors="replace")
    assert len(rows) == len(set(rows)), "a request was counted twice"
    assert served <= set(rows), f"{len(served - set(rows))} requests that got a 200 have no entry"
    assert set(spooled) <= set(rows)
    # Besides the 200s and the warm-up, only requests in flight at the kill (sent before it,
    # answered by a dropped connection) may have a row; those sent after it reached no one.
    assert len(rows) - len(served) - 1 <= tally.count("down", 0)
