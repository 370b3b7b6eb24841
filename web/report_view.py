"""The cost report as the page shows it: the table rows, the sums per bucket and model, charts.

Every number comes from the reports service's `CostReport` and is written by
the reports' own schema structs (`CostRow`, `CostTotals`), the ones the JSON
API and the CSV use: the page cannot disagree with `/admin/reports/costs`.
Buckets with no traffic are filled with zeros so the charts' time axis is
the whole period asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from markupsafe import Markup

from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.schemas import CostRow, CostTotals, money_text
from hydrant.platform.reports.service import CostReport
from hydrant.web.charts import Bar, Series, bar_chart, line_chart

MAX_CHART_BUCKETS = 24 * 62


@dataclass
class BucketSums:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    charged: Decimal = Decimal(0)
    device_cost: Decimal = Decimal(0)


@dataclass(frozen=True)
class Chart:
    title: str
    svg: Markup


@dataclass
class ReportPage:
    rows: list[CostRow]
    totals: CostTotals
    charts: list[Chart] = field(default_factory=list)
    by_model: list[tuple[str, Decimal, int]] = field(default_factory=list)


def bucket_starts(query: ReportQuery) -> list[datetime]:
    step = timedelta(days=1) if query.group_by == "day" else timedelta(hours=1)
    since = query.since.astimezone(UTC)
    if query.group_by == "day":
        start = since.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        start = since.replace(minute=0, second=0, microsecond=0)
    starts: list[datetime] = []
    moment = start
    while moment < query.until and len(starts) < MAX_CHART_BUCKETS:
        starts.append(moment)
        moment += step
    return starts


def bucket_label(moment: datetime, group_by: str) -> str:
    return f"{moment:%Y-%m-%d}" if group_by == "day" else f"{moment:%Y-%m-%d %H:00}"


def tick_label(moment: datetime, group_by: str) -> str:
    return f"{moment:%m-%d}" if group_by == "day" else f"{moment:%d %H:00}"


def build(report: CostReport, *, show_device_cost: bool) -> ReportPage:
    query = report.query
    sums: dict[datetime, BucketSums] = defaultdict(BucketSums)
    models: dict[str, list[Decimal | int]] = defaultdict(lambda: [Decimal(0), 0])
    for row in report.rows:
        bucket = sums[row.bucket.astimezone(UTC)]
        bucket.requests += row.requests
        bucket.input_tokens += row.input_tokens
        bucket.output_tokens += row.output_tokens
        bucket.charged += row.charged
        bucket.device_cost += row.device_cost
        models[row.model][0] = Decimal(models[row.model][0]) + row.charged
        models[row.model][1] = int(models[row.model][1]) + row.requests
    starts = bucket_starts(query)
    labels = [bucket_label(s, query.group_by) for s in starts]
    ticks = [tick_label(s, query.group_by) for s in starts]
    per = [sums.get(s, BucketSums()) for s in starts]
    unit = "day" if query.group_by == "day" else "hour"
    charts = [
        _chart(
            line_chart,
            "requests",
            f"Requests per {unit}",
            labels,
            [Series("requests", [b.requests for b in per], "series-1")],
            "",
            ticks,
        ),
        _chart(
            line_chart,
            "tokens",
            f"Tokens per {unit}",
            labels,
            [
                Series("input tokens", [b.input_tokens for b in per], "series-1"),
                Series("output tokens", [b.output_tokens for b in per], "series-2"),
            ],
            "",
            ticks,
        ),
    ]
    cost_series = [Series("charged", [b.charged for b in per], "series-1")]
    if show_device_cost:
        cost_series.append(Series("device cost", [b.device_cost for b in per], "series-3"))
    charts.append(
        _chart(line_chart, "cost", f"Cost per {unit} (USD)", labels, cost_series, "", ticks)
    )
    ranked = sorted(models.items(), key=lambda item: (-Decimal(item[1][0]), item[0]))
    bars = [
        Bar(name, Decimal(values[0]), money_text(Decimal(values[0]))) for name, values in ranked
    ]
    charts.append(_chart(bar_chart, "by-model", "Charged by model (USD)", bars))
    return ReportPage(
        rows=[CostRow.of(r) for r in report.rows],
        totals=CostTotals.of(report.totals),
        charts=charts,
        by_model=[(name, Decimal(v[0]), int(v[1])) for name, v in ranked],
    )


def _chart(draw: Callable[..., Markup], kind: str, title: str, *args: Any) -> Chart:
    return Chart(title=title, svg=draw(kind, title, *args))
