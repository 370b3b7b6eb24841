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
from functools import lru_cache


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
        return _day_window(moment.year, moment.month, moment.day)
    return _month_window(moment.year, moment.month)


# Every admission asks for the current day and month: computed (and formatted) once each.
@lru_cache(maxsize=64)
def _day_window(year: int, month: int, day: int) -> PeriodWindow:
    start = datetime(year, month, day, tzinfo=UTC)
    return PeriodWindow(
        BudgetPeriod.DAY, start.strftime("%Y-%m-%d"), start, start + timedelta(days=1)
    )


@lru_cache(maxsize=16)
def _month_window(year: int, month: int) -> PeriodWindow:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC) if month == 12 else start.replace(month=month + 1)
    return PeriodWindow(BudgetPeriod.MONTH, start.strftime("%Y-%m"), start, end)
