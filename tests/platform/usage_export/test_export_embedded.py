"""The export job on the embedded scheduler (the gateway's loop, no Celery): with a receiver
configured, the closed hours' records reach it; on the embedded SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from export_factories import records, seed_ledger
from receiver import SECRET, Receiver

from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.settings import load_settings


async def test_the_export_runs_on_the_embedded_scheduler(
    db: Database, data_dir: Path, receiver: Receiver
) -> None:
    await seed_ledger(db, count=50, hours=5, seed=11)
    settings = load_settings(
        {},
        data_dir=data_dir,
        database_url=db.url,
        usage_export_url=receiver.url,
        usage_export_format="json",
        usage_export_secret=SECRET,
        usage_export_batch_size=2,
        # The scheduler runs on the real clock and the ledger is at BASE (March 2026): no
        # retention, or its hours could be past the horizon on the day the test runs.
        usage_export_retention_days=0,
    )
    export = tuple(replace(p, every_s=0.05) for p in PERIODIC if p.name == "usage-export")
    jobs = EmbeddedScheduler(
        settings, db, JOB_TABLE, periodic=export, tick_s=0.02, first_tick_after_s=0
    )
    await jobs.start()
    try:
        for _ in range(600):
            made = await records(db)
            if made and {r.status for r in made} == {"sent"}:
                break
            await asyncio.sleep(0.05)
    finally:
        await jobs.stop()
    made = await records(db)
    assert len(made) == 5 and {r.status for r in made} == {"sent"}
    assert set(receiver.accepted) == {r.idempotency_key for r in made}
    assert max(receiver.posts.values()) == 1
