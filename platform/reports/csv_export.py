"""CSV downloads of the reports: a header row, one line per JSON row, the same cell text.

The cells are the JSON view's values (built by the same `schemas` structs),
so a CSV and a JSON report of one query can never disagree. There is no totals
line: a spreadsheet summing a column would count it twice; the sum of each
column is the JSON `totals`. Text cells that a spreadsheet would run as a
formula (a leading `=`, `+`, `-`, `@`) are quoted with a leading apostrophe.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

import msgspec

from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.schemas import CostRow, UsageRow
from hydrant.platform.reports.service import CostReport

COST_COLUMNS: tuple[str, ...] = CostRow.__struct_fields__
USAGE_COLUMNS: tuple[str, ...] = UsageRow.__struct_fields__
_TEXT_COLUMNS = frozenset({"tenant_id", "model", "group"})
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
CSV_MEDIA_TYPE = "text/csv"  # Litestar adds `; charset=utf-8` to text/* types


def _cell(column: str, value: object) -> str:
    text = "" if value is None else str(value)  # a group without the attribution: empty
    if column in _TEXT_COLUMNS and text.startswith(_FORMULA_STARTS):
        return "'" + text
    return text


def _write(columns: Sequence[str], rows: Sequence[msgspec.Struct]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        values = msgspec.structs.asdict(row)
        writer.writerow([_cell(c, values[c]) for c in columns])
    return buffer.getvalue()


def _columns(columns: tuple[str, ...], report: CostReport) -> tuple[str, ...]:
    """The `group` column only in a report by an attribution, named after it."""
    if report.query.by is None:
        return tuple(c for c in columns if c != "group")
    return columns


def cost_report_csv(report: CostReport) -> str:
    return _write(_columns(COST_COLUMNS, report), [CostRow.of(r) for r in report.rows])


def usage_csv(report: CostReport) -> str:
    return _write(_columns(USAGE_COLUMNS, report), [UsageRow.of(r) for r in report.rows])


def download_name(kind: str, query: ReportQuery) -> str:
    """`hydrant-costs-20260101-20260108.csv`: safe in a Content-Disposition header."""
    return f"hydrant-{kind}-{query.since:%Y%m%d}-{query.until:%Y%m%d}.csv"
