"""Writing the outbox: one usage record per (tenant, model, closed UTC hour) from the ledger.

The ledger is the one source of truth, so each run sums it again with the reports'
exact aggregate (`reports.repository.aggregate`, by hour) rather than reading the hourly
rollups, which are rewritten only for the last few hours and so are not final for a
late entry. An hour is closed `usage_export_settle_s` after it ends; until then nothing
of it is written. What was written already is compared with the ledger's sums: a
difference (entries that arrived late, e.g. replayed from a gateway's spool) becomes a
further record with the next sequence number and its own key, never an edit of one a
receiver may have counted.

Which hours to look at: those of the entries recorded in the last
`usage_export_lookback_hours` (by `recorded_at`, when the entry reached the database),
so an entry that arrives days late for an old hour is still found, as long as the job
runs at least once within the lookback; never an hour before the retention's horizon
(`usage_export_retention_days`, retention.py says why): its records may be purged.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.billing.money import STORAGE_PLACES
from hydrant.platform.db.models import LedgerEntry, UsageExportRecord
from hydrant.platform.db.session import Database
from hydrant.platform.reports import repository as reports
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.rollups import hour_floor
from hydrant.platform.usage_export.retention import horizon

log = logging.getLogger(__name__)


def idempotency_key(tenant_id: str, model: str, hour: datetime, sequence: int) -> str:
    """Stable across runs and processes: the same record always carries the same key."""
    text = f"{tenant_id}\n{model}\n{hour.isoformat()}\n{sequence}"
    return hashlib.sha256(text.encode()).hexdigest()


def closed_until(now: datetime, settle: timedelta) -> datetime:
    """The end of the closed hours: hour H is closed once H + 1 h + settle has passed."""
    return hour_floor(now - settle)


@dataclass(frozen=True)
class _Exported:
    """What the records of one (tenant, model, hour) add up to so far."""

    records: int
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: Decimal


async def _first_hour(
    session: AsyncSession, recorded_since: datetime, until: datetime
) -> datetime | None:
    earliest = await session.scalar(
        select(func.min(LedgerEntry.finished_at)).where(
            LedgerEntry.recorded_at >= recorded_since, LedgerEntry.finished_at < until
        )
    )
    return None if earliest is None else hour_floor(reports.bucket_value(earliest))


async def _exported(
    session: AsyncSession, since: datetime, until: datetime
) -> dict[tuple[str, str, datetime], _Exported]:
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    r = UsageExportRecord
    result = await session.execute(
        select(
            r.tenant_id,
            r.model,
            r.hour,
            func.count(),
            func.sum(r.requests),
            func.sum(r.input_tokens),
            func.sum(r.cached_tokens),
            func.sum(r.output_tokens),
            reports.exact_sum(dialect, r.charged, STORAGE_PLACES),
        )
        .where(r.hour >= since, r.hour < until)
        .group_by(r.tenant_id, r.model, r.hour)
    )
    return {
        (row[0], row[1], reports.bucket_value(row[2])): _Exported(
            records=int(row[3]),
            requests=int(row[4]),
            input_tokens=int(row[5]),
            cached_tokens=int(row[6]),
            output_tokens=int(row[7]),
            charged=reports.exact_value(row[8], dialect, STORAGE_PLACES),
        )
        for row in result.all()
    }


def _record(row: reports.AggregateRow, before: _Exported | None) -> UsageExportRecord | None:
    """The first record of an hour, or the correction that brings its records to the ledger."""
    sequence = 0 if before is None else before.records
    values = {
        "requests": row.requests,
        "input_tokens": row.input_tokens,
        "cached_tokens": row.cached_tokens,
        "output_tokens": row.output_tokens,
        "charged": row.charged,
    }
    if before is not None:
        values = {name: value - getattr(before, name) for name, value in values.items()}
        if not any(values.values()):
            return None
    return UsageExportRecord(
        idempotency_key=idempotency_key(row.tenant_id, row.model, row.bucket, sequence),
        tenant_id=row.tenant_id,
        model=row.model,
        hour=row.bucket,
        sequence=sequence,
        **values,
    )


async def write_records(
    database: Database,
    now: datetime,
    *,
    settle: timedelta,
    lookback: timedelta,
    retention: timedelta | None = None,
) -> int:
    """Add the records the closed hours are owed; returns how many were written.

    Two exporters running at once compute the same records; the unique (tenant, model,
    hour, sequence) lets one transaction in and rolls the other back whole (0 written).
    Hours before the retention's horizon are left alone (None: no retention).
    """
    until = closed_until(now, settle)
    oldest = horizon(now, retention)
    try:
        async with database.session() as session:
            since = await _first_hour(session, now - lookback, until)
            if since is None:
                return 0
            if oldest is not None and since < oldest:
                log.warning(
                    "usage export: ledger entries arrived for hours past the export's"
                    " retention; they stay in the ledger but are not exported",
                    extra={"earliest_hour": since, "horizon": oldest},
                )
                since = oldest
                if since >= until:
                    return 0
            rows = await reports.aggregate(
                session, CONSOLE, ReportQuery(since=since, until=until, group_by="hour")
            )
            exported = await _exported(session, since, until)
            records = [
                record
                for row in rows
                if (record := _record(row, exported.get((row.tenant_id, row.model, row.bucket))))
                is not None
            ]
            session.add_all(records)
    except IntegrityError:
        log.info("usage export: another exporter wrote these hours' records first")
        return 0
    if records:
        corrections = sum(1 for r in records if r.sequence > 0)
        log.info(
            "usage export: records written",
            extra={"records": len(records), "corrections": corrections, "until": until},
        )
    return len(records)
