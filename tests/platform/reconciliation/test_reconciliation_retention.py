"""The reconciliation's retention: the hourly purge job deletes the daily rows and the
worker timeline of days past HYDRANT_RECONCILIATION_RETENTION_DAYS, a batch at a time
with progress, and a day past it is refused (400) rather than reported or stored from
what is left. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from report_factories import add_models, add_tenants, insert_rows, row
from sqlalchemy import func, select

from hydrant.platform.db.models import PoolReconciliation, ReconciliationLine, WorkerStateInterval
from hydrant.platform.db.session import Database
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.scheduler import EmbeddedScheduler
from hydrant.platform.reconciliation.deps import reconciliation_service
from hydrant.platform.reconciliation.retention import purge_expired
from hydrant.settings import load_settings

FIRST = date(2026, 11, 1)
DAYS = 10
NOW = datetime(2026, 11, 12, 6, 0, tzinfo=UTC)  # retention 4 days: 2026-11-08 is the oldest kept


def at(day: date, hour: int) -> datetime:
    return datetime(day.year, day.month, day.day, hour, tzinfo=UTC)


async def seed(db: Database) -> None:
    """Each day: a worker loading 09-10 and ready 10-22 (one interval runs 22:00 into the
    next day's 02:00), and a request of two tenants; then the day's rows stored."""
    async with db.session() as session:
        tenants = await add_tenants(session, ["a", "b"])
        models = await add_models(session, ["tiny"])
        rows = []
        for n in range(DAYS):
            day = FIRST + timedelta(days=n)
            for state, start, end in (
                ("starting", at(day, 9), at(day, 10)),
                ("ready", at(day, 10), at(day, 22)),
                ("sleeping", at(day, 22), at(day, 22) + timedelta(hours=4)),
            ):
                session.add(
                    WorkerStateInterval(
                        worker_id="w1",
                        model="tiny",
                        device="cpu",
                        state=state,
                        started_at=start,
                        ended_at=end,
                    )
                )
            for tenant in ("a", "b"):
                rows.append(
                    row(tenants[tenant], "tiny", at(day, 12), "1.5", request_id=f"{tenant}{n}")
                )
        await insert_rows(session, rows, models)


async def counts(db: Database) -> tuple[set[date], int, int]:
    async with db.session() as session:
        days = set(await session.scalars(select(PoolReconciliation.day)))
        lines = await session.scalar(select(func.count()).select_from(ReconciliationLine))
        intervals = await session.scalar(select(func.count()).select_from(WorkerStateInterval))
    return days, int(lines or 0), int(intervals or 0)


async def test_the_job_purges_past_days_whole_and_refuses_them_after(
    db: Database, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await seed(db)
    settings = load_settings({}, data_dir=data_dir, reconciliation_retention_days=4)
    clock = [at(FIRST, 0)]
    jobs = EmbeddedScheduler(settings, db, JOB_TABLE, clock=lambda: clock[0], periodic=())
    for n in range(DAYS):  # each day stored by the job as it went, before any purge
        day = FIRST + timedelta(days=n)
        clock[0] = at(day + timedelta(days=1), 1)
        await jobs.run("hydrant.billing.reconcile", {"day": day.isoformat()})
    days, lines, intervals = await counts(db)
    assert (len(days), lines, intervals) == (DAYS, 2 * DAYS, 3 * DAYS)

    clock[0] = NOW
    with caplog.at_level(logging.INFO, logger="hydrant.platform.reconciliation.tasks"):
        result = await jobs.run("hydrant.billing.purge_reconciliation")
    oldest = date(2026, 11, 8)
    past = (oldest - FIRST).days  # 7 days: 11-01 to 11-07
    # 11-07's sleeping interval ends at 11-08 02:00, past the horizon's start: it stays.
    assert result == {
        "pool_days": past,
        "tenant_lines": 2 * past,
        "intervals": 3 * past - 1,
        "oldest_day": oldest.isoformat(),
    }
    days, lines, intervals = await counts(db)
    assert days == {oldest + timedelta(days=n) for n in range(DAYS - past)}
    assert (lines, intervals) == (2 * (DAYS - past), 3 * (DAYS - past) + 1)
    logged = {
        (r.__dict__["table"], r.__dict__["deleted"])
        for r in caplog.records
        if r.getMessage() == "reconciliation purge"
    }
    assert logged == {
        ("reconciliation_lines", 2 * past),
        ("pool_reconciliations", past),
        ("worker_state_intervals", 3 * past - 1),
    }
    assert await jobs.run("hydrant.billing.purge_reconciliation") == {
        "pool_days": 0,
        "tenant_lines": 0,
        "intervals": 0,
        "oldest_day": oldest.isoformat(),
    }

    async with db.session() as session:
        service = reconciliation_service(session, settings, lambda: NOW)
        kept = await service.report(oldest)
        assert kept.source == "stored" and kept.pools[0].balances
        for refused in (service.report, service.store):
            with pytest.raises(InvalidRequest) as info:
                await refused(oldest - timedelta(days=1))
            assert info.value.param == "day" and "retention of 4 days" in info.value.message
    # The job asked for such a day fails (logged: the scheduler's None) and stores nothing.
    assert await jobs.run("hydrant.billing.reconcile", {"day": "2026-11-02"}) is None
    assert (await counts(db))[0] == days


async def test_batches_report_progress_and_zero_days_keep_everything(db: Database) -> None:
    await seed(db)
    heard: list[tuple[str, int, int]] = []

    def progress(table: str):  # type: ignore[no-untyped-def]
        return lambda done, of: heard.append((table, done, of))

    assert await purge_expired(db, NOW, 0, progress=progress) == {
        "pool_days": 0,
        "tenant_lines": 0,
        "intervals": 0,
    }
    assert (await counts(db))[2] == 3 * DAYS and heard == []
    deleted = await purge_expired(db, NOW, 4, progress=progress)
    assert deleted["intervals"] == 3 * 7 - 1
    timeline = [(done, of) for table, done, of in heard if table == "worker_state_intervals"]
    assert timeline == [(20, 20)]  # 5000 a batch: one batch
