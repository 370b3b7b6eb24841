"""Budget periods: calendar days and months in UTC, each with a label and an end.

Why calendar periods (not rolling 24 h): invoices and the daily digest are per
calendar day and month, so the budget a tenant sees matches the bill. Why the
label is part of the key: a new period starts from zero by using a new key,
with no reset job that could fail or run late.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum


class BudgetPeriod(StrEnum):
    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True)
class PeriodWindow:
    period: BudgetPeriod
    label: str
    start: datetime
    end: datetime


def period_window(period: BudgetPeriod | str, at: datetime) -> PeriodWindow:
    """The UTC day or month containing `at` (which must be timezone-aware)."""
    kind = BudgetPeriod(period)
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("at must be a timezone-aware datetime")
    moment = at.astimezone(UTC)
    if kind is BudgetPeriod.DAY:
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return PeriodWindow(kind, start.strftime("%Y-%m-%d"), start, start + timedelta(days=1))
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if start.month == 12:
        end = start.replace(year=start.year + 1, month=1)
    else:
        end = start.replace(month=start.month + 1)
    return PeriodWindow(kind, start.strftime("%Y-%m"), start, end)
