"""The numbers a digest shows, all read through the reports service (the ledger's one query).

A tenant's "yesterday" is its own calendar day in its IANA time zone, so the
period is cut at local midnights (23 or 25 hours on DST days) and handed to
the reports service as a UTC range; each of the eight days (yesterday, the
day before, and the seven days before yesterday for the average) is one
report. The admin digest works on the UTC day.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.digests.budgets import BudgetUse
from hydrant.platform.digests.repository import KeySpend
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.repository import AggregateRow
from hydrant.platform.reports.service import ReportService, ReportTotals

WEEK = 7


def local_day_window(day: date, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """`[start, end)` of `day` in `zone`, in UTC."""
    start = datetime.combine(day, time(0), tzinfo=zone).astimezone(UTC)
    end = datetime.combine(day + timedelta(days=1), time(0), tzinfo=zone).astimezone(UTC)
    return start, end


def change_percent(now: Decimal, before: Decimal) -> Decimal | None:
    """Relative change in percent; None when there is nothing to compare with."""
    if before == 0:
        return None
    return (now - before) * 100 / before


@dataclass(frozen=True)
class DayReport:
    day: date
    totals: ReportTotals
    by_model: dict[str, ReportTotals]
    by_tenant: dict[str, ReportTotals] = field(default_factory=dict)


def _group(rows: Sequence[AggregateRow], key: str) -> dict[str, ReportTotals]:
    groups: dict[str, list[AggregateRow]] = defaultdict(list)
    for row in rows:
        groups[getattr(row, key)].append(row)
    return {name: ReportTotals.of(group) for name, group in sorted(groups.items())}


async def day_report(
    reports: ReportService, day: date, zone: ZoneInfo, tenant_id: str | None
) -> DayReport:
    since, until = local_day_window(day, zone)
    report = await reports.costs(
        CONSOLE, ReportQuery(since=since, until=until, group_by="day", tenant_id=tenant_id)
    )
    return DayReport(
        day=day,
        totals=report.totals,
        by_model=_group(report.rows, "model"),
        by_tenant=_group(report.rows, "tenant_id"),
    )


@dataclass(frozen=True)
class Line:
    """One model (or tenant) in a digest: yesterday, the day before, the 7-day average."""

    name: str
    day: ReportTotals
    previous: ReportTotals
    week_charged: Decimal  # sum over the seven days before `day`

    @property
    def tokens(self) -> int:
        return self.day.input_tokens + self.day.output_tokens

    @property
    def week_average(self) -> Decimal:
        return self.week_charged / WEEK

    @property
    def vs_previous(self) -> Decimal | None:
        return change_percent(self.day.charged, self.previous.charged)

    @property
    def vs_week(self) -> Decimal | None:
        return change_percent(self.day.charged, self.week_average)


def _lines(
    current: dict[str, ReportTotals], previous: dict[str, ReportTotals], week: list[DayReport]
) -> list[Line]:
    names = set(current) | set(previous)
    lines = []
    for name in names:
        week_charged = sum((d.by_model.get(name, ReportTotals()).charged for d in week), Decimal(0))
        lines.append(
            Line(
                name=name,
                day=current.get(name, ReportTotals()),
                previous=previous.get(name, ReportTotals()),
                week_charged=week_charged,
            )
        )
    return sorted(lines, key=lambda line: (-line.day.charged, line.name))


@dataclass(frozen=True)
class TenantDigest:
    tenant_id: str
    tenant_name: str
    timezone: str
    day: date
    totals: ReportTotals
    previous: ReportTotals
    week_charged: Decimal
    week_requests: int
    lines: list[Line]
    series: list[tuple[date, Decimal]]  # charged per day, oldest first, ending with `day`
    top_keys: list[KeySpend]
    budgets: list[BudgetUse]

    @property
    def has_usage(self) -> bool:
        return self.totals.requests > 0

    @property
    def tokens(self) -> int:
        return self.totals.input_tokens + self.totals.output_tokens

    @property
    def week_average(self) -> Decimal:
        return self.week_charged / WEEK

    @property
    def vs_previous(self) -> Decimal | None:
        return change_percent(self.totals.charged, self.previous.charged)

    @property
    def vs_week(self) -> Decimal | None:
        return change_percent(self.totals.charged, self.week_average)


async def tenant_days(
    reports: ReportService, tenant_id: str, day: date, zone: ZoneInfo
) -> list[DayReport]:
    """Reports for `day - 7` … `day` (oldest first): eight local days of one tenant."""
    return [
        await day_report(reports, day - timedelta(days=back), zone, tenant_id)
        for back in range(WEEK, -1, -1)
    ]


def build_tenant_digest(
    *,
    tenant_id: str,
    tenant_name: str,
    timezone: str,
    days: list[DayReport],
    top_keys: list[KeySpend],
    budgets: list[BudgetUse],
) -> TenantDigest:
    current, previous, week = days[-1], days[-2], days[:-1]
    return TenantDigest(
        tenant_id=tenant_id,
        tenant_name=tenant_name,
        timezone=timezone,
        day=current.day,
        totals=current.totals,
        previous=previous.totals,
        week_charged=sum((d.totals.charged for d in week), Decimal(0)),
        week_requests=sum(d.totals.requests for d in week),
        lines=_lines(current.by_model, previous.by_model, week),
        series=[(d.day, d.totals.charged) for d in days],
        top_keys=top_keys,
        budgets=budgets,
    )


@dataclass(frozen=True)
class Mover:
    tenant_id: str
    name: str
    day: Decimal
    previous: Decimal

    @property
    def delta(self) -> Decimal:
        return self.day - self.previous

    @property
    def change(self) -> Decimal | None:
        return change_percent(self.day, self.previous)


@dataclass(frozen=True)
class AdminDigest:
    day: date
    totals: ReportTotals
    previous: ReportTotals
    by_tenant: list[tuple[str, ReportTotals]]  # (tenant name, totals), by revenue
    by_model: list[tuple[str, ReportTotals]]
    movers: list[Mover]
    series: list[tuple[date, Decimal]]

    @property
    def has_usage(self) -> bool:
        return self.totals.requests > 0


def build_admin_digest(
    days: list[DayReport], names: dict[str, str], movers: int = 5
) -> AdminDigest:
    current, previous = days[-1], days[-2]

    def ranked(
        groups: dict[str, ReportTotals], label: dict[str, str]
    ) -> list[tuple[str, ReportTotals]]:
        return sorted(
            ((label.get(k, k), v) for k, v in groups.items()),
            key=lambda kv: (-kv[1].charged, kv[0]),
        )

    changes = [
        Mover(
            tenant_id=t,
            name=names.get(t, t),
            day=current.by_tenant.get(t, ReportTotals()).charged,
            previous=previous.by_tenant.get(t, ReportTotals()).charged,
        )
        for t in set(current.by_tenant) | set(previous.by_tenant)
    ]
    changes.sort(key=lambda m: (-abs(m.delta), m.name))
    return AdminDigest(
        day=current.day,
        totals=current.totals,
        previous=previous.totals,
        by_tenant=ranked(current.by_tenant, names),
        by_model=ranked(current.by_model, {}),
        movers=[m for m in changes if m.delta != 0][:movers],
        series=[(d.day, d.totals.charged) for d in days],
    )
