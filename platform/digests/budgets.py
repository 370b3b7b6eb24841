"""How much of each budget a tenant has used in the current period, read from the ledger.

Budgets are the plan's (tokens and spend, per UTC day and month, see
quotas/periods.py), and a project's or an API key's own (migration 0016) under the
same four names; usage comes from the reports service so the digest, the alerts and
`/admin/reports/costs` agree to the micro-unit (a project's and a key's from the same
report grouped `by` project or key: the ledger entry's own attribution). Tokens are
input plus output, as the quota gate settles them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from hydrant.platform.auth.principal import CONSOLE
from hydrant.platform.db.models import ApiKey, Plan, Project
from hydrant.platform.quotas.periods import BudgetPeriod, period_window
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.repository import AggregateRow
from hydrant.platform.reports.service import ReportService, ReportTotals

# (budget name, plan column, unit, period): the same names as the quota checks.
BUDGETS: tuple[tuple[str, str, str, BudgetPeriod], ...] = (
    ("tokens_day", "tokens_per_day", "tokens", BudgetPeriod.DAY),
    ("tokens_month", "tokens_per_month", "tokens", BudgetPeriod.MONTH),
    ("spend_day", "spend_per_day", "spend", BudgetPeriod.DAY),
    ("spend_month", "spend_per_month", "spend", BudgetPeriod.MONTH),
)


Scope = Literal["tenant", "project", "key"]
SCOPES: tuple[Scope, ...] = ("tenant", "project", "key")


@dataclass(frozen=True)
class BudgetOwner:
    """A project or a key that sets budgets of its own: what an alert names it by."""

    scope: Scope
    id: str
    name: str
    limits: Mapping[str, int | Decimal | None]  # plan column name -> limit (None: none)

    @classmethod
    def of_project(cls, project: Project) -> BudgetOwner:
        return cls("project", project.id, one_line(project.name), _limits(project))

    @classmethod
    def of_key(cls, key: ApiKey) -> BudgetOwner:
        # The prefix is public (the key's list shows it); it tells apart keys of one name.
        name = f"{one_line(key.name)} ({key.prefix})" if key.name.strip() else key.prefix
        return cls("key", key.id, name, _limits(key))


def one_line(name: str) -> str:
    """A name as a mail subject can carry it: runs of white space (a line break included,
    which a header refuses) as one space."""
    return " ".join(name.split())


def _limits(row: Plan | Project | ApiKey) -> dict[str, int | Decimal | None]:
    return {column: getattr(row, column) for _, column, _, _ in BUDGETS}


@dataclass(frozen=True)
class BudgetUse:
    budget: str
    unit: str  # "tokens" or "spend"
    period: str  # the period's label: 2026-12-02 or 2026-12
    used: Decimal
    limit: Decimal
    scope: Scope = "tenant"
    owner_id: str = ""  # the tenant's, project's or key's id
    owner_name: str = ""

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

    @property
    def owner(self) -> str:
        """Whose budget it is, for a person: "" for the tenant's, else `project "web"`."""
        if self.scope == "tenant":
            return ""
        return f'{"project" if self.scope == "project" else "API key"} "{self.owner_name}"'


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
                budget=name,
                unit=unit,
                period=label,
                used=_used(totals, unit),
                limit=Decimal(limit),
                owner_id=tenant_id,
            )
        )
    return uses


async def owner_budget_uses(
    reports: ReportService,
    tenant_id: str,
    owners: Sequence[BudgetOwner],
    now: datetime,
) -> list[BudgetUse]:
    """Each budget the owners (all projects or all keys of one tenant) set, with what each
    used of it in the period holding `now`: one report per period, grouped by owner."""
    if not owners:
        return []
    scope = owners[0].scope
    if any(owner.scope != scope for owner in owners):
        raise ValueError("owner_budget_uses takes projects or keys, not both")
    uses: list[BudgetUse] = []
    by_period: dict[BudgetPeriod, tuple[str, dict[str, ReportTotals]]] = {}
    for name, column, unit, period in BUDGETS:
        if all(owner.limits.get(column) is None for owner in owners):
            continue
        if period not in by_period:
            window = period_window(period, now)
            query = ReportQuery(since=window.start, until=window.end, tenant_id=tenant_id, by=scope)
            report = await reports.costs(CONSOLE, query)
            rows_of: dict[str, list[AggregateRow]] = {}
            for row in report.rows:
                if row.group is not None:
                    rows_of.setdefault(row.group, []).append(row)
            totals = {group: ReportTotals.of(rows) for group, rows in rows_of.items()}
            by_period[period] = (window.label, totals)
        label, totals = by_period[period]
        for owner in owners:
            limit = owner.limits.get(column)
            if limit is None:
                continue
            uses.append(
                BudgetUse(
                    budget=name,
                    unit=unit,
                    period=label,
                    used=_used(totals.get(owner.id, ReportTotals()), unit),
                    limit=Decimal(limit),
                    scope=scope,
                    owner_id=owner.id,
                    owner_name=owner.name,
                )
            )
    return uses
