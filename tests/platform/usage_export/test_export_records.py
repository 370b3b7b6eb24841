"""The outbox holds exactly the ledger: per (tenant, model, closed hour), to the micro-unit,
on SQLite and PostgreSQL; late entries add correction records with keys of their own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from export_factories import ledger_sums, record_sums, records, relabel, rows_across_hours
from report_factories import BASE, add_models, add_tenants, insert_rows

from hydrant.platform.db.session import Database
from hydrant.platform.usage_export.outbox import idempotency_key, write_records

SETTLE = timedelta(minutes=5)
LOOKBACK = timedelta(days=7)


@pytest.mark.parametrize("seed", [1, 2])
async def test_records_equal_the_ledger_per_hour_and_late_entries_add_corrections(
    db: Database, seed: int
) -> None:
    async with db.session() as session:
        tenants = list((await add_tenants(session, ["acme", "beta"])).values())
        models = await add_models(session, ["alpha", "beta-7b"])
    first = rows_across_hours(tenants, list(models), 250, 12, seed=seed)
    async with db.session() as session:
        await insert_rows(session, first, models)

    # Hours 0-7 closed (hour 7 ended at 8:00, 8:05 is past its settle delay); 8+ open.
    now = BASE + timedelta(hours=8, minutes=5)
    written = await write_records(db, now, settle=SETTLE, lookback=LOOKBACK)
    closed = BASE + timedelta(hours=8)
    expected = ledger_sums(first, closed)
    got = await records(db)
    assert written == len(got) == len(expected)
    assert record_sums(got) == expected
    assert {r.sequence for r in got} == {0}
    assert all(r.hour < closed for r in got)
    # Still within hour 8's settle delay at 9:04: nothing of it yet; a rerun adds nothing.
    assert (
        await write_records(db, now + timedelta(minutes=59), settle=SETTLE, lookback=LOOKBACK) == 0
    )

    # Late entries for hours already exported (and for open ones), then all hours close.
    late = relabel(rows_across_hours(tenants, list(models), 60, 12, seed=seed + 100), "late_")
    async with db.session() as session:
        await insert_rows(session, late, models)
    later = BASE + timedelta(hours=13)
    await write_records(db, later, settle=SETTLE, lookback=LOOKBACK)
    got = await records(db)
    assert record_sums(got) == ledger_sums([*first, *late], BASE + timedelta(hours=12))

    exported_before = set(expected)
    corrected = {(r.tenant_id, r.model, r.hour) for r in got if r.sequence > 0}
    late_closed = {k for k in ledger_sums(late, closed)}
    assert corrected == late_closed & exported_before  # a correction wherever one was owed
    for r in got:  # each key is the stable hash of what it names, and unique
        assert r.idempotency_key == idempotency_key(r.tenant_id, r.model, r.hour, r.sequence)
    assert len({r.idempotency_key for r in got}) == len(got)
    # A first record is never edited: its values are still the first run's.
    firsts = {(r.tenant_id, r.model, r.hour): r for r in got if r.sequence == 0}
    for key, sums in expected.items():
        first_record = firsts[key]
        assert (first_record.requests, first_record.charged) == (sums[0], sums[4])
