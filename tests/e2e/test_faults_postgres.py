"""PostgreSQL stopped and restarted under load (a real stop of a private cluster).

While the database process is gone the gateway keeps serving keys it has
verified (auth cache) and writes ledger entries to its spool; when the
database is back the spool replays, and the ledger holds exactly one row for
every request that got a 200, none twice.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from fault_load import Tally, gateway_env, private_pg, steady_load, until
from hydrant_server import hydrant_server
from private_services import PrivatePostgres
from test_ledger_faults import BODY, ledger_ids, wait_for, wait_for_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
__all__ = ["private_pg"]  # a fixture, used by name


async def test_gateway_serves_through_a_postgres_stop_and_restart(
    private_pg: PrivatePostgres, demo_model_dir: Path, tmp_path: Path
) -> None:
    with hydrant_server(tmp_path, demo_model_dir, env=gateway_env(private_pg.url)) as server:
        tenant_id, first = server.tenant_key("pg-restart")
        warm = server.new_key(tenant_id)  # verified just before the stop: in the auth cache
        spool = server.data_dir / "ledger.spool"
        tally = Tally()
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            for key in (first, warm):
                warm_up = await client.post("/v1/chat/completions", json=BODY, headers=_auth(key))
                assert warm_up.status_code == 200
            clients = [asyncio.create_task(steady_load(client, warm, tally)) for _ in range(3)]
            try:
                await until(tally, "before", 10)
                await asyncio.to_thread(private_pg.stop)
                tally.phase = "down"
                await until(tally, "down", 8)
                spooled = spool.stat().st_size
                await asyncio.to_thread(private_pg.start)
                tally.phase = "after"
                await until(tally, "after", 10)
            finally:
                tally.done = True
                await asyncio.gather(*clients)

        statuses = [status for _, status, _ in tally.statuses]
        assert statuses == [200] * len(statuses), sorted(set(statuses))
        assert tally.count("down", 200) >= 8
        assert spooled > 0, "nothing was spooled while the database was stopped"
        served = tally.ok_ids()
        assert len(served) == len(tally.statuses)
        rows = await wait_for_rows(private_pg.url, tenant_id, set(served))
        assert len(rows) == len(set(rows)), "a request was counted twice"
        assert served <= set(rows), f"{len(served - set(rows))} served requests have no entry"
        assert len(rows) == len(served) + 2  # and the two warm-up requests
        assert await wait_for(lambda: spool.stat().st_size == 0, 15)
        assert len(await ledger_ids(private_pg.url, tenant_id)) == len(rows)  # settled
        log = server.log_file.read_text(errors="replace")
        assert "ledger database unreachable" in log
        assert "spooled ledger entries replayed" in log


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
