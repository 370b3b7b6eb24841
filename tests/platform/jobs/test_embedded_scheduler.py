"""The embedded default: no Redis, no Celery; the same jobs on the event loop, mail to `.eml`."""

from __future__ import annotations

import asyncio
import email
import email.policy
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

from digest_factories import (
    DAY,
    SEND_AT,
    ledger_rows,
    make_ledger,
    make_world,
    random_traffic,
    record,
)
from sqlalchemy import select

from hydrant.platform.db.models import LedgerHourlyRollup
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.settings import load_settings


async def wait_until(condition, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_jobs_run_on_the_loop_without_redis(db: Database, data_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir, database_url=db.url)
    assert settings.redis_url is None and settings.smtp_url is None
    world = await make_world(db)
    ledger = make_ledger(db, data_dir)
    await random_traffic(ledger, world)
    hour = SEND_AT - timedelta(hours=1)
    for minute in (10, 40):
        await record(
            ledger,
            world,
            key="backend",
            model="qwen-tiny",
            finished_at=hour + timedelta(minutes=minute),
            tokens=(5_000, 100, 700),
        )
    fast = tuple(replace(p, every_s=0.05) for p in PERIODIC)
    jobs = EmbeddedScheduler(
        settings,
        db,
        JOB_TABLE,
        periodic=fast,
        tick_s=0.02,
        first_tick_after_s=0,
        clock=lambda: SEND_AT,
    )
    assert {p.job for p in jobs.periodic} == {
        "hydrant.digests.dispatch",
        "hydrant.budgets.check",
        "hydrant.credits.check_low_balance",
        "hydrant.credits.pay_pending",
        "hydrant.invoices.finalize",
        "hydrant.ledger.rollup",
        "hydrant.adapters.hosting_fees",
        "hydrant.responses.purge",
        "hydrant.files.purge",
        "hydrant.batches.sweep",
        "hydrant.billing.export_usage",
        "hydrant.billing.reconcile",
        "hydrant.billing.purge_usage_export",
        "hydrant.billing.purge_reconciliation",
    }  # the gateway replays its own spool; the scheduler does not
    outbox = settings.effective_outbox_dir

    await jobs.start()
    try:

        async def digests_written() -> bool:
            return len(list(outbox.glob("*.eml"))) >= 4  # 2 digests, 2 invoice mails

        async def dispatched_often() -> bool:
            return sum(1 for name, _ in jobs.completed if name == "hydrant.digests.dispatch") >= 5

        await wait_until(digests_written)
        await wait_until(dispatched_often)
        await jobs.idle()
    finally:
        await jobs.stop()

    # one digest per recipient, however many times the dispatcher ran; November closed,
    # so the invoices job mailed its invoice too (once per recipient)
    files = sorted(outbox.glob("*.eml"))
    mails = [email.message_from_bytes(f.read_bytes(), policy=email.policy.default) for f in files]
    invoices = [m for m in mails if " invoice HYD-" in str(m["Subject"])]
    assert sorted(m["To"] for m in invoices) == ["cfo@acme.test", "ops@acme.test"]
    received = [m for m in mails if m not in invoices]
    assert len(received) == 2
    assert {m["To"] for m in received} == {"ops@acme.test", "cfo@acme.test"}
    assert all(m["Subject"] == f"Hydrant usage for acme on {DAY.isoformat()}" for m in received)
    assert not list(outbox.glob("*.part"))

    # and the hourly rollup holds the ledger's sums for that hour
    async with db.session() as session:
        rollups = list(
            await session.scalars(select(LedgerHourlyRollup).where(LedgerHourlyRollup.hour == hour))
        )
    truth = await ledger_rows(db, world.tenant_id, hour, SEND_AT)
    assert sum(r.requests for r in rollups) == len(truth) >= 2
    assert sum((r.charged for r in rollups), Decimal(0)) == sum(
        (r.charged for r in truth), Decimal(0)
    )


async def test_the_gateway_lifespan_starts_and_stops_the_scheduler(
    db: Database, data_dir: Path
) -> None:
    """What `hydrant serve` does on the embedded default: the scheduler rides the gateway."""
    from litestar.testing import AsyncTestClient

    from hydrant.platform.app import create_app
    from hydrant.platform.models.registry import ModelRegistry
    from hydrant.platform.services import build_services

    settings = load_settings({}, data_dir=data_dir, database_url=db.url)
    services = build_services(
        settings, database=Database(db.url), registry=ModelRegistry(), models=()
    )
    jobs = EmbeddedScheduler(
        settings,
        services.database,
        JOB_TABLE,
        tick_s=0.02,
        first_tick_after_s=0,
        clock=lambda: SEND_AT,
    )
    services.background.append(jobs)
    app = create_app(settings, services)

    async with AsyncTestClient(app) as client:
        assert (await client.get("/healthz")).status_code == 200

        async def ran() -> bool:
            names = {name for name, _ in jobs.completed}
            return {"hydrant.digests.dispatch", "hydrant.ledger.rollup"} <= names

        await asyncio.to_thread(client.blocking_portal.call, wait_until, ran)
    assert jobs._loop_task is None  # stopped with the gateway, before its database closed
