"""The usage export's retention: delivered records of hours past it are purged by the hourly
job, a batch at a time with progress; records not delivered stay; and an hour past the
horizon is never exported again, so a late entry cannot make a purged hour count twice.
On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from export_factories import records, seed_ledger
from report_factories import BASE, insert_rows, row
from sqlalchemy import select, update

from hydrant.errors import ConfigurationError
from hydrant.platform.db.models import ModelDeployment, UsageExportRecord
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.platform.usage_export.outbox import write_records
from hydrant.platform.usage_export.retention import purge_delivered
from hydrant.settings import load_settings

SETTLE = timedelta(minutes=5)
LOOKBACK = timedelta(days=7)
RETENTION = timedelta(days=10)
DAYS = 4  # of ledger from BASE, an entry or more in most hours


async def mark_sent(db: Database, before_hour: int) -> None:
    """Delivered: every record of an hour before BASE + `before_hour` hours."""
    async with db.session() as session:
        await session.execute(
            update(UsageExportRecord)
            .where(UsageExportRecord.hour < BASE + timedelta(hours=before_hour))
            .values(status="sent", sent_at=BASE + timedelta(hours=before_hour))
        )


async def test_delivered_records_past_the_retention_go_and_stay_unexported(
    db: Database,
) -> None:
    tenants, _ = await seed_ledger(db, count=300, hours=DAYS * 24, seed=5)
    end = BASE + timedelta(days=DAYS, minutes=10)
    assert await write_records(db, end, settle=SETTLE, lookback=LOOKBACK, retention=RETENTION)
    await mark_sent(db, before_hour=60)  # hours 60+ not delivered yet (receiver down)
    before = await records(db)

    # Twelve days after hour 0, the horizon is hour 48: hours 0-47 are past it.
    now = BASE + timedelta(days=12)
    horizon = BASE + timedelta(hours=48)
    heard: list[tuple[int, int]] = []
    deleted = await purge_delivered(
        db, now, RETENTION, batch=7, progress=lambda done, of: heard.append((done, of))
    )
    gone = [r for r in before if r.hour < horizon]
    assert deleted == len(gone) > 7
    after = await records(db)
    assert {r.id for r in after} == {r.id for r in before if r.hour >= horizon}
    assert all(r.status != "sent" for r in after if r.hour >= BASE + timedelta(hours=60))
    # one line per batch of 7, each with how far it got, the last one at the total
    assert [done for done, _ in heard] == [*range(7, deleted, 7), deleted]
    assert {of for _, of in heard} == {deleted}
    assert await purge_delivered(db, now, RETENTION) == 0  # nothing left to do

    # Late entries: one for a purged hour, one for a kept hour. Only the kept hour gets a
    # correction; the purged one is not written again under its sequence 0 key (which a
    # receiver that forgot the key would count twice).
    async with db.session() as session:
        alpha = await session.scalar(
            select(ModelDeployment.id).where(ModelDeployment.name == "alpha")
        )
        models = {"alpha": str(alpha)}
        late = [
            row(tenants["acme"], "alpha", BASE + timedelta(hours=3), "1.25", request_id="late1"),
            row(tenants["acme"], "alpha", BASE + timedelta(hours=50), "2.5", request_id="late2"),
        ]
        await insert_rows(session, late, models)
    written = await write_records(db, now, settle=SETTLE, lookback=LOOKBACK, retention=RETENTION)
    new = [r for r in await records(db) if r.id not in {x.id for x in after}]
    assert written == len(new) == 1
    kept_hour = BASE + timedelta(hours=50)
    assert new[0].hour == kept_hour
    assert new[0].sequence == sum(1 for r in after if r.hour == kept_hour)  # the next one
    # Without a retention the purged hour is found again (what the horizon prevents).
    again = await write_records(db, now, settle=SETTLE, lookback=LOOKBACK)
    assert again >= 1
    assert any(r.hour == BASE + timedelta(hours=3) for r in await records(db))


async def test_the_hourly_job_purges_with_progress_in_the_log(
    db: Database, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await seed_ledger(db, count=60, hours=48, seed=9)
    end = BASE + timedelta(days=2, minutes=10)
    await write_records(db, end, settle=SETTLE, lookback=LOOKBACK)
    await mark_sent(db, before_hour=48)
    total = len(await records(db))
    now = BASE + timedelta(days=30)
    settings = load_settings({}, data_dir=data_dir, usage_export_retention_days=20)
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: now, periodic=())
    with caplog.at_level(logging.INFO, logger="hydrant.platform.usage_export.tasks"):
        result = await jobs.run("hydrant.billing.purge_usage_export")
    assert result == {"deleted": total, "horizon": (BASE + timedelta(days=10)).isoformat()}
    assert await records(db) == []
    [line] = [r for r in caplog.records if r.getMessage() == "usage export purge"]
    assert (line.__dict__["deleted"], line.__dict__["of"]) == (total, total)

    kept = load_settings({}, data_dir=data_dir, usage_export_retention_days=0)
    forever = EmbeddedScheduler(kept, db, JOB_TABLE, clock=lambda: now, periodic=())
    assert await forever.run("hydrant.billing.purge_usage_export") == {
        "deleted": 0,
        "horizon": None,
    }


def test_a_retention_within_the_lookback_is_refused(data_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="USAGE_EXPORT_RETENTION_DAYS"):
        load_settings({}, data_dir=data_dir, usage_export_retention_days=7)  # = 168 h lookback
    with pytest.raises(ConfigurationError, match="USAGE_EXPORT_RETENTION_DAYS"):
        load_settings({}, data_dir=data_dir, usage_export_retention_days=-1)
    with pytest.raises(ConfigurationError, match="RECONCILIATION_RETENTION_DAYS"):
        load_settings({}, data_dir=data_dir, reconciliation_retention_days=1)
    settings = load_settings(
        {}, data_dir=data_dir, usage_export_retention_days=8, reconciliation_retention_days=2
    )
    assert (settings.usage_export_retention_days, settings.reconciliation_retention_days) == (8, 2)
