"""The usage export's retention: delivered records older than it are deleted, and no record
is ever written for an hour older than it.

Why both halves: the outbox finds what an hour is owed by comparing the ledger with the
records already written for it (outbox.py). Were an hour's records deleted while the
outbox still looked at it, a late ledger entry for it would make it write the whole hour
again under sequence 0's key, with other values: a receiver that still knew the key would
drop real usage, one that did not would count the hour twice. So the outbox and this
purge share one horizon (`horizon`), which only moves forward: hours before it are
finished for the export. A ledger entry that arrives later than the retention for its
hour stays in the ledger (and in invoices and reports) but is not exported; the outbox
logs it. The retention must therefore exceed `usage_export_lookback_hours` (settings
refuse a shorter one). Records not yet delivered (`pending`, `sending`: a receiver down
for weeks, a tenant with no Stripe customer yet) are kept whatever their age.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from hydrant.platform.db.models import UsageExportRecord
from hydrant.platform.db.purge import PURGE_BATCH, Progress, delete_in_batches
from hydrant.platform.db.session import Database
from hydrant.platform.reports.rollups import hour_floor


def horizon(now: datetime, retention: timedelta | None) -> datetime | None:
    """The first hour still within the retention; None: records are kept forever."""
    if retention is None or retention <= timedelta(0):
        return None
    return hour_floor(now - retention)


async def purge_delivered(
    database: Database,
    now: datetime,
    retention: timedelta | None,
    *,
    batch: int = PURGE_BATCH,
    progress: Progress | None = None,
) -> int:
    """Delete the delivered records of hours before the horizon, a batch per transaction;
    how many went. `progress` hears after each batch (the job logs it)."""
    before = horizon(now, retention)
    if before is None:
        return 0
    r = UsageExportRecord
    due = (r.status == "sent", r.hour < before)
    return await delete_in_batches(database, r, due, batch=batch, progress=progress)
