"""The usage export on a gateway (`hydrant serve`, its embedded job loop) SIGKILLed in the
middle of a delivery: nothing is lost, nothing is counted twice.

The receiver takes the first batch and never answers, so the gateway dies with that batch
claimed (`sending`) and unmarked. A new gateway on the same data folder, once the lease has
passed, claims the batch again and re-sends it with the same idempotency keys: the receiver
ends with every record of the outbox, each key accepted once (the stranded batch posted
twice), and every record `sent`. The job-worker kill is tested beside the other delivery
tests (tests/platform/usage_export/test_export_delivery.py); this is the gateway's.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest
from hydrant_server import hydrant_server, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "reports"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "usage_export"))

from export_factories import records, seed_ledger
from receiver import SECRET, Receiver, running

from hydrant.platform.db import migrate
from hydrant.platform.db.models import UsageExportRecord
from hydrant.platform.db.session import Database

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_S = 3


async def _seed(url: str) -> None:
    database = Database(url)
    try:
        await seed_ledger(database, count=40, hours=4, seed=23)
    finally:
        await database.dispose()


async def _records(url: str) -> list[UsageExportRecord]:
    database = Database(url)
    try:
        return await records(database)
    finally:
        await database.dispose()


def test_a_gateway_killed_mid_delivery_resends_and_loses_nothing(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    url = f"sqlite+aiosqlite:///{data / 'hydrant.db'}"
    migrate.upgrade(url)
    asyncio.run(_seed(url))  # closed hours in the gateway's own database
    with running(Receiver()) as receiver:
        receiver.script = ["hang"]  # takes the first batch, then never answers
        receiver.hang_s = 120
        env = {
            "HYDRANT_USAGE_EXPORT_URL": receiver.url,
            "HYDRANT_USAGE_EXPORT_FORMAT": "json",
            "HYDRANT_USAGE_EXPORT_SECRET": SECRET,
            "HYDRANT_USAGE_EXPORT_BATCH_SIZE": "4",
            "HYDRANT_USAGE_EXPORT_TIMEOUT_S": "120",
            "HYDRANT_USAGE_EXPORT_LEASE_S": str(LEASE_S),
            "HYDRANT_USAGE_EXPORT_BACKOFF_S": "0",
            # The seeded ledger is in March 2026: no retention horizon to fall behind.
            "HYDRANT_USAGE_EXPORT_RETENTION_DAYS": "0",
        }
        with hydrant_server(data, demo_model_dir, env=env) as server:
            assert receiver.got_one.wait(90), server.log_file.read_text(errors="replace")[-3000:]
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=10)
        assert server.process.returncode == -signal.SIGKILL
        stranded = asyncio.run(_records(url))
        sending = {r.idempotency_key for r in stranded if r.status == "sending"}
        assert len(sending) == 4 and sending == set(receiver.accepted)  # the batch it had
        assert {r.status for r in stranded} <= {"sending", "pending"}

        time.sleep(LEASE_S)  # the dead gateway's claim lapses
        with hydrant_server(data, demo_model_dir, env=env):

            def all_sent() -> bool:
                return {r.status for r in asyncio.run(_records(url))} == {"sent"}

            assert wait_for(all_sent, 90, every_s=0.3), [
                r.status for r in asyncio.run(_records(url))
            ]
    final = asyncio.run(_records(url))
    assert set(receiver.accepted) == {r.idempotency_key for r in final}  # nothing lost
    assert {receiver.posts[k] for k in sending} == {2}  # the stranded batch: re-sent ...
    assert all(n == 1 for k, n in receiver.posts.items() if k not in sending)  # the rest once
    assert len(receiver.accepted) == len(final)  # ... and each key counted once
