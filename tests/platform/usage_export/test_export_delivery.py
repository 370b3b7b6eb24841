"""Delivery to a real HTTP receiver that honours the idempotency key like Stripe: the meter
event's shape, retries on 500 and timeouts with backoff, a job worker SIGKILLed mid-delivery,
two exporters at once. PostgreSQL, as production runs it."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from export_factories import records, seed_ledger
from receiver import SECRET, Receiver, running

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.session import Database
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.usage_export.delivery import ExportTarget, deliver
from hydrant.platform.usage_export.outbox import write_records
from hydrant.platform.usage_export.service import BillingCustomerService

pytestmark = pytest.mark.integration

SETTLE = timedelta(minutes=5)
LOOKBACK = timedelta(days=7)


def target(url: str, fmt: str = "stripe", **overrides: object) -> ExportTarget:
    values: dict[str, object] = {
        "url": url,
        "format": fmt,
        "secret": SECRET,
        "event_name": "hydrant_tokens",
        "batch_size": 100,
        "backoff": timedelta(0),
        "lease": timedelta(minutes=5),
        "timeout_s": 5.0,
    }
    values.update(overrides)
    return ExportTarget(**values)  # type: ignore[arg-type]


async def run(database: Database, to: ExportTarget, at: datetime | None = None) -> object:
    async with httpx.AsyncClient(timeout=to.timeout_s) as client:
        return await deliver(database, to, client, (lambda: at) if at else utcnow)


async def test_stripe_meter_events_have_stripe_shape_and_wait_for_a_customer(
    pg: Database, receiver: Receiver
) -> None:
    tenants, _ = await seed_ledger(pg, count=40, hours=4, seed=3, tenants=("acme", "beta"))
    await write_records(pg, utcnow(), settle=SETTLE, lookback=LOOKBACK)
    async with pg.session() as session:
        await BillingCustomerService(session).set(CONSOLE, tenants["acme"], "cus_Acme123")
        with pytest.raises(InvalidRequest):
            await BillingCustomerService(session).set(CONSOLE, tenants["beta"], "acme; drop table")

    report = await run(pg, target(receiver.url))
    by_key = {r.idempotency_key: r for r in await records(pg)}
    acme = {k for k, r in by_key.items() if r.tenant_id == tenants["acme"]}
    assert set(receiver.accepted) == acme and acme
    assert report.waiting == len(by_key) - len(acme) > 0  # type: ignore[attr-defined]
    for key, event in receiver.accepted.items():
        record = by_key[key]
        assert event == {
            "event_name": "hydrant_tokens",
            "payload[stripe_customer_id]": "cus_Acme123",
            "payload[value]": str(record.input_tokens + record.output_tokens),
            "identifier": key,
            "timestamp": str(int(record.hour.timestamp())),
        }
        assert record.status == "sent" and record.sent_at is not None

    async with pg.session() as session:  # beta's customer is set: its records go too
        await BillingCustomerService(session).set(CONSOLE, tenants["beta"], "cus_Beta456")
    await run(pg, target(receiver.url))
    assert set(receiver.accepted) == set(by_key)
    assert max(receiver.posts.values()) == 1


async def test_retries_after_500_and_timeouts_with_backoff_and_each_record_counts_once(
    pg: Database, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await seed_ledger(pg, count=60, hours=6, seed=4)
    await write_records(pg, utcnow(), settle=SETTLE, lookback=LOOKBACK)
    keys = {r.idempotency_key for r in await records(pg)}
    now = utcnow()

    # A 500: the batch goes back to pending, not due again until the backoff has passed.
    receiver.script = ["500"]
    slow = target(receiver.url, "json", batch_size=4, backoff=timedelta(seconds=30))
    report = await run(pg, slow, now)
    assert (report.sent, report.failed) == (0, 1)  # type: ignore[attr-defined]
    failed = [r for r in await records(pg) if r.attempts]
    assert len(failed) == 4 and {r.last_error for r in failed} == {"HTTP 500"}
    assert all(r.next_attempt_at == now + timedelta(seconds=30) for r in failed)
    assert all(r.status == "pending" for r in failed)

    # Then the receiver accepts a batch but answers too late (a timeout), then fails again.
    receiver.script = ["hang", "500"]
    quick = target(receiver.url, "json", batch_size=4, timeout_s=0.5)
    later = now + timedelta(seconds=31)
    for _ in range(5):
        await run(pg, quick, later)
    got = await records(pg)
    assert {r.status for r in got} == {"sent"}
    assert set(receiver.accepted) == keys  # every record received ...
    assert sorted(set(receiver.posts.values())) == [1, 2]  # ... the timed-out batch twice,
    assert sum(1 for n in receiver.posts.values() if n == 2) == 4  # and counted once
    warned = [r for r in caplog.records if "receiver failed" in r.getMessage()]
    assert len(warned) == 3  # a 500, a timeout, a 500: each logged ...
    assert all(SECRET not in str(r.__dict__) for r in caplog.records)  # ... never the secret
    for record in got:  # the generic JSON: money as decimal strings
        sent = receiver.accepted[record.idempotency_key]
        assert Decimal(sent["charged"]) == record.charged and isinstance(sent["charged"], str)
        assert sent["input_tokens"] == record.input_tokens
        assert sent["stripe_customer_id"] is None  # none set: json does not wait for one


async def test_a_job_worker_killed_mid_delivery_resends_and_nothing_is_lost(
    pg_url: str, pg: Database, tmp_path: Path
) -> None:
    tenants, _ = await seed_ledger(pg, count=30, hours=3, seed=5)
    async with pg.session() as session:
        await BillingCustomerService(session).set(CONSOLE, tenants["acme"], "cus_Acme123")
    with running(Receiver()) as receiver:
        receiver.script = ["hang"]  # accepts the first event, then never answers
        receiver.hang_s = 60
        env = {
            **os.environ,
            "HYDRANT_DATABASE_URL": pg_url,
            "HYDRANT_DATA_DIR": str(tmp_path),
            "HYDRANT_USAGE_EXPORT_URL": receiver.url,
            "HYDRANT_USAGE_EXPORT_SECRET": SECRET,
            "HYDRANT_USAGE_EXPORT_TIMEOUT_S": "120",
        }
        log = tmp_path / "worker.log"
        with log.open("wb") as stderr:
            worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hydrant.cli",
                    "jobs",
                    "run",
                    "hydrant.billing.export_usage",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        try:
            got_one = await asyncio.to_thread(receiver.got_one.wait, 120)
            assert got_one, log.read_text()[-2000:]
        finally:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
        first = next(iter(receiver.accepted))
        stranded = await records(pg)
        assert {r.status for r in stranded} == {"sending"}  # claimed, never marked

        # Within the lease nobody takes them; after it, the next run re-sends every one.
        lease = timedelta(minutes=5)
        assert (await run(pg, target(receiver.url), utcnow())).sent == 0  # type: ignore[attr-defined]
        after = utcnow() + lease + timedelta(seconds=1)
        report = await run(pg, target(receiver.url), after)
        assert report.sent == len(stranded)  # type: ignore[attr-defined]
        assert {r.status for r in await records(pg)} == {"sent"}
        assert set(receiver.accepted) == {r.idempotency_key for r in stranded}
        assert receiver.posts[first] == 2  # sent before the kill and again: counted once
        assert all(n == 1 for key, n in receiver.posts.items() if key != first)


async def test_two_exporters_at_once_never_send_a_record_twice(pg_url: str, pg: Database) -> None:
    tenants, _ = await seed_ledger(pg, count=120, hours=40, seed=6)
    async with pg.session() as session:
        await BillingCustomerService(session).set(CONSOLE, tenants["acme"], "cus_Acme123")
    other = Database(pg_url)
    try:
        now = utcnow()
        written = await asyncio.gather(
            write_records(pg, now, settle=SETTLE, lookback=LOOKBACK),
            write_records(other, now, settle=SETTLE, lookback=LOOKBACK),
        )
        total = len(await records(pg))
        assert sorted(written) == [0, total]  # one transaction wins, the other adds nothing
        with running(Receiver(delay_s=0.02)) as receiver:
            to = target(receiver.url, batch_size=3)
            reports = await asyncio.gather(run(pg, to), run(other, to))
    finally:
        await other.dispose()
    sent = [r.sent for r in reports]  # type: ignore[attr-defined]
    assert sum(sent) == total and all(n > 0 for n in sent)  # both worked, side by side
    assert len(receiver.accepted) == total
    assert max(receiver.posts.values()) == 1  # and no record went out twice


async def test_a_receiver_that_goes_down_mid_run_and_restarts_counts_each_record_once(
    pg: Database,
) -> None:
    tenants, _ = await seed_ledger(pg, count=60, hours=12, seed=7)
    async with pg.session() as session:
        await BillingCustomerService(session).set(CONSOLE, tenants["acme"], "cus_Acme123")
    await write_records(pg, utcnow(), settle=SETTLE, lookback=LOOKBACK)
    keys = {r.idempotency_key for r in await records(pg)}
    receiver = Receiver()
    receiver.script = ["ok", "ok", "crash"]  # the third event is taken, then it goes down
    with running(receiver):
        to = target(receiver.url, batch_size=5)
        report = await run(pg, to)
        assert (report.sent, report.failed) == (2, 1)  # type: ignore[attr-defined]
        assert len(receiver.accepted) == 3
        assert await asyncio.to_thread(receiver.down.wait, 10)
        down = await run(pg, to)  # nobody listens on the port: refused, kept pending
        assert (down.sent, down.failed) == (0, 1)  # type: ignore[attr-defined]
        assert {r.last_error for r in await records(pg) if r.status == "pending"} >= {
            "ConnectError"
        }
    with running(receiver, port=receiver.port):  # restarted, with what it had accepted
        await run(pg, to)
    assert {r.status for r in await records(pg)} == {"sent"}
    assert set(receiver.accepted) == keys
    assert sorted(set(receiver.posts.values())) == [1, 2]  # the crashed one came twice
