"""How much of each budget a tenant has used in the current period, read from the ledger.

Budgets are the plan's (tokens and spend, per UTC day and month, see
quotas/periods.py); usage comes from the reports service so the digest, the
alerts and `/admin/reports/costs` agree to the micro-unit. Tokens are input
plus output, as the quota gate settles them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.models import Plan
from hydrant.platform.quotas.periods import BudgetPeriod, period_window
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.service import ReportService, ReportTotals

# (budget name, plan column, unit, period): the same names as the quota checks.
BUDGETS: tuple[tuple[str, str, str, BudgetPeriod], ...] = (
    ("tokens_day", "tokens_per_day", "tokens", BudgetPeriod.DAY),
    ("tokens_month", "tokens_per_month", "tokens", BudgetPeriod.MONTH),
    ("spend_day", "spend_per_day", "spend", BudgetPeriod.DAY),
    ("spend_month", "spend_per_month", "spend", BudgetPeriod.MONTH),
)


@dataclass(frozen=True)
class BudgetUse:
    budget: str
    unit: str  # "tokens" or "spend"
    period: str  # the period's label: 2026-12-02 or 2026-12
    used: Decimal
    limit: Decimal

    @property
    def percent(self) -> Decimal:
        """Share used, in percent; a zero budget counts as fully used."""
        if self.limit <= 0:
            return Decimal(100)
        return self.used * 100 / self.limit

    @property
    def label(self) -> str:
        what = "Tokens" if self.unit == "tokens" else "Spend"
        return f"{what} per {'day' if self.budget.endswith('_day') else 'month'}"


def _used(totals: ReportTotals, unit: str) -> Decimal:
    if unit == "tokens":
        return Decimal(totals.input_tokens + totals.output_tokens)
    return totals.charged


async def budget_uses(
    reports: ReportService, tenant_id: str, plan: Plan | None, now: datetime
) -> list[BudgetUse]:
    """Each budget the plan sets, with what the tenant used of it in the period holding `now`."""
    if plan is None:
        return []
    uses: list[BudgetUse] = []
    totals_by_period: dict[BudgetPeriod, tuple[str, ReportTotals]] = {}
    for name, column, unit, period in BUDGETS:
        limit = getattr(plan, column)
        if limit is None:
            continue
        if period not in totals_by_period:
            window = period_window(period, now)
            query = ReportQuery(since=window.start, until=window.end, tenant_id=tenant_id)
            report = await reports.costs(CONSOLE, query)
            totals_by_period[period] = (window.label, report.totals)
        label, totals = totals_by_period[period]
        uses.append(
            BudgetUse(
                budget=name, unit=unit, period=label, used=_used(totals, unit), limit=Decimal(limit)
            )
        )
    return uses
