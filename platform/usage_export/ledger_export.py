"""`hydrant billing export`: per-hour usage summed from the ledger, as CSV or JSON lines.

Read straight from the ledger (the reports' exact aggregate, by hour), not from the
outbox, so a file covers any period, exported to a receiver or not, and always agrees
with the ledger. The period is read a day at a time: memory stays bounded for a year's
export and each day reports its progress.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from typing import Any

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.session import Database
from hydrant.platform.reports import repository as reports
from hydrant.platform.reports.query import ReportQuery

COLUMNS = (
    "hour",
    "tenant_id",
    "model",
    "requests",
    "input_tokens",
    "cached_tokens",
    "output_tokens",
    "charged",
)
CHUNK = timedelta(days=1)


def row_values(row: reports.AggregateRow) -> dict[str, Any]:
    """One hour's usage; money as a decimal string (never a float)."""
    return {
        "hour": row.bucket.isoformat(),
        "tenant_id": row.tenant_id,
        "model": row.model,
        "requests": row.requests,
        "input_tokens": row.input_tokens,
        "cached_tokens": row.cached_tokens,
        "output_tokens": row.output_tokens,
        "charged": str(row.charged),
    }


async def hourly_usage(
    database: Database,
    since: datetime,
    until: datetime,
    *,
    tenant_id: str | None = None,
    progress: Callable[[datetime, datetime, int], None] | None = None,
) -> AsyncIterator[reports.AggregateRow]:
    """Every (hour, tenant, model) of `[since, until)` in order, a day's query at a time."""
    start = since
    while start < until:
        end = min(start + CHUNK, until)
        async with database.session() as session:
            rows = await reports.aggregate(
                session,
                CONSOLE,
                ReportQuery(since=start, until=end, group_by="hour", tenant_id=tenant_id),
            )
        for row in rows:
            yield row
        if progress is not None:
            progress(start, end, len(rows))
        start = end


class Formatter:
    """Turns rows into the file's text: a CSV header then lines, or one JSON object a line."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt

    def header(self) -> str:
        return self._csv(COLUMNS) if self.fmt == "csv" else ""

    def line(self, row: reports.AggregateRow) -> str:
        values = row_values(row)
        if self.fmt == "csv":
            return self._csv([values[c] for c in COLUMNS])
        return json.dumps(values) + "\n"

    @staticmethod
    def _csv(cells: Any) -> str:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\r\n").writerow(cells)
        return buffer.getvalue()
