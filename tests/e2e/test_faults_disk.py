"""Disk full for the spool: with the database down and no room to spool, refuse new work.

A request's ledger entry must land somewhere durable before the gateway can
vouch for it; with the database stopped and the spool unable to take one more
entry (its byte cap reached, or a disk that refuses writes: `/dev/full`), the
gateway must stop serving rather than serve unmetered. When the database is
back it serves again, and every request that got a 200 has exactly one row.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
from fault_load import gateway_env, private_pg
from hydrant_server import hydrant_server
from private_services import PrivatePostgres
from test_ledger_faults import BODY, wait_for_rows

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]
__all__ = ["private_pg"]  # a fixture, used by name

REFUSED = {503}


async def post(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
    )


@pytest.mark.parametrize("disk", ["cap", "dev-full"])
async def test_spool_full_refuses_new_work(
    disk: str, private_pg: PrivatePostgres, demo_model_dir: Path, tmp_path: Path
) -> None:
    if disk == "dev-full" and not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    extra = {"HYDRANT_SPOOL_MAX_BYTES": "2000"} if disk == "cap" else {}
    if disk == "dev-full":
        (tmp_path / "ledger.spool").symlink_to("/dev/full")  # every write: ENOSPC
    env = gateway_env(private_pg.url, **extra)
    with hydrant_server(tmp_path, demo_model_dir, env=env) as server:
        tenant_id, key = server.tenant_key("disk-full")
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            assert (await post(client, key)).status_code == 200  # key in the auth cache
            await asyncio.to_thread(private_pg.stop)
            down = [await post(client, key) for _ in range(12)]
            codes = [r.status_code for r in down]
            refused_at = next((i for i, c in enumerate(codes) if c != 200), None)
            assert refused_at is not None, f"served {codes}: unmetered while nothing could record"
            if disk == "dev-full":
                assert refused_at == 0  # nothing could be spooled at all
            else:
                assert refused_at >= 1  # the spool took entries until its cap
            # From the first refusal on, every request is refused, cleanly.
            assert all(c in REFUSED for c in codes[refused_at:]), codes
            error = down[-1].json()["error"]
            assert set(error) >= {"message", "type", "code"}
            assert error["code"] == "ledger_unavailable"
            assert down[-1].headers.get("retry-after")
            served_down = {r.headers["x-request-id"] for r in down if r.status_code == 200}

            await asyncio.to_thread(private_pg.start)
            back = None
            for _ in range(60):  # bounded: the gateway notices the database within seconds
                back = await post(client, key)
                if back.status_code == 200:
                    break
                await asyncio.sleep(0.5)
            assert back is not None and back.status_code == 200
        rows = await wait_for_rows(private_pg.url, tenant_id, served_down)
        assert served_down <= set(rows)
        assert len(rows) == len(set(rows))
        log = server.log_file.read_text(errors="replace")
        assert "ledger spool full with the database unreachable: refusing requests" in log
        assert "ledger database reachable again: accepting requests" in log
