"""JSON shapes of the reports, and the one way each number is written (JSON, CSV, CLI alike).

Money is a string, never a JSON float: row amounts and exact totals with the
6 places they are stored with, and the totals once more rounded to cents
(`rounded`), the only rounding a report does. The tenant's `/v1/usage` shows
what it was charged and nothing of the platform's own device cost or margin.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal

from msgspec import Struct

from hydrant.platform.billing.money import REPORT_PLACES, STORAGE_PLACES, round_money
from hydrant.platform.reports.query import Bucket
from hydrant.platform.reports.repository import SECONDS_PLACES, AggregateRow
from hydrant.platform.reports.service import CostReport, ReportTotals

_SECONDS_QUANTUM = Decimal(1).scaleb(-SECONDS_PLACES)


def money_text(amount: Decimal, places: int = STORAGE_PLACES) -> str:
    """`round_money` to `places` (a no-op at 6 for stored sums), written without exponent."""
    return f"{round_money(amount, places):f}"


def seconds_text(seconds: Decimal) -> str:
    return f"{seconds.quantize(_SECONDS_QUANTUM):f}"


def moment_text(moment: datetime) -> str:
    """ISO 8601 in UTC with a `Z` (microseconds only when there are any)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Period(Struct, kw_only=True):
    since: str
    until: str
    group_by: Bucket
    by: str | None = None  # the attribution rows are grouped by (`key`, `project`, ...)


class RoundedTotals(Struct, kw_only=True):
    charged: str
    device_cost: str
    margin: str
    batch_charged: str


class CostRow(Struct, kw_only=True):
    bucket: str
    tenant_id: str
    model: str
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: str
    device_seconds: str
    device_cost: str
    device_cost_estimated: bool  # an upstream pool's model: the gateway's estimate
    margin: str
    batch_requests: int  # of `requests`, the Batch API's lines
    batch_charged: str  # of `charged`, theirs (at the batch price)
    group: str | None = None  # the key, project, hashed user or tag value (`by`)

    @classmethod
    def of(cls, row: AggregateRow) -> CostRow:
        return cls(
            bucket=moment_text(row.bucket),
            tenant_id=row.tenant_id,
            model=row.model,
            requests=row.requests,
            input_tokens=row.input_tokens,
            cached_tokens=row.cached_tokens,
            output_tokens=row.output_tokens,
            charged=money_text(row.charged),
            device_seconds=seconds_text(row.device_seconds),
            device_cost=money_text(row.device_cost),
            device_cost_estimated=row.device_cost_estimated,
            margin=money_text(row.margin),
            batch_requests=row.batch_requests,
            batch_charged=money_text(row.batch_charged),
            group=row.group,
        )


class CostTotals(Struct, kw_only=True):
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: str
    device_seconds: str
    device_cost: str
    margin: str
    batch_requests: int
    batch_charged: str
    rounded: RoundedTotals

    @classmethod
    def of(cls, totals: ReportTotals) -> CostTotals:
        return cls(
            requests=totals.requests,
            input_tokens=totals.input_tokens,
            cached_tokens=totals.cached_tokens,
            output_tokens=totals.output_tokens,
            charged=money_text(totals.charged),
            device_seconds=seconds_text(totals.device_seconds),
            device_cost=money_text(totals.device_cost),
            margin=money_text(totals.margin),
            batch_requests=totals.batch_requests,
            batch_charged=money_text(totals.batch_charged),
            rounded=RoundedTotals(
                charged=money_text(totals.charged, REPORT_PLACES),
                device_cost=money_text(totals.device_cost, REPORT_PLACES),
                margin=money_text(totals.margin, REPORT_PLACES),
                batch_charged=money_text(totals.batch_charged, REPORT_PLACES),
            ),
        )


def _period(report: CostReport) -> Period:
    q = report.query
    return Period(
        since=moment_text(q.since), until=moment_text(q.until), group_by=q.group_by, by=q.by
    )


class CostReportView(Struct, kw_only=True):
    object: Literal["cost_report"] = "cost_report"
    period: Period
    tenant_id: str | None
    model: str | None
    data: list[CostRow]
    totals: CostTotals

    @classmethod
    def of(cls, report: CostReport) -> CostReportView:
        return cls(
            period=_period(report),
            tenant_id=report.query.tenant_id,
            model=report.query.model,
            data=[CostRow.of(r) for r in report.rows],
            totals=CostTotals.of(report.totals),
        )


class UsageRow(Struct, kw_only=True):
    bucket: str
    model: str
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: str
    batch_requests: int
    batch_charged: str
    group: str | None = None  # the key, project, hashed user or tag value (`by`)

    @classmethod
    def of(cls, row: AggregateRow) -> UsageRow:
        return cls(
            bucket=moment_text(row.bucket),
            model=row.model,
            requests=row.requests,
            input_tokens=row.input_tokens,
            cached_tokens=row.cached_tokens,
            output_tokens=row.output_tokens,
            charged=money_text(row.charged),
            batch_requests=row.batch_requests,
            batch_charged=money_text(row.batch_charged),
            group=row.group,
        )


class UsageRounded(Struct, kw_only=True):
    charged: str
    batch_charged: str


class UsageTotals(Struct, kw_only=True):
    requests: int
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: str
    batch_requests: int
    batch_charged: str
    rounded: UsageRounded

    @classmethod
    def of(cls, totals: ReportTotals) -> UsageTotals:
        return cls(
            requests=totals.requests,
            input_tokens=totals.input_tokens,
            cached_tokens=totals.cached_tokens,
            output_tokens=totals.output_tokens,
            charged=money_text(totals.charged),
            batch_requests=totals.batch_requests,
            batch_charged=money_text(totals.batch_charged),
            rounded=UsageRounded(
                charged=money_text(totals.charged, REPORT_PLACES),
                batch_charged=money_text(totals.batch_charged, REPORT_PLACES),
            ),
        )


class UsageView(Struct, kw_only=True):
    object: Literal["usage"] = "usage"
    period: Period
    model: str | None
    data: list[UsageRow]
    totals: UsageTotals

    @classmethod
    def of(cls, report: CostReport) -> UsageView:
        return cls(
            period=_period(report),
            model=report.query.model,
            data=[UsageRow.of(r) for r in report.rows],
            totals=UsageTotals.of(report.totals),
        )
