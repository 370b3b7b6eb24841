"""From a tenant's quota and one request to the checks a backend runs.

Why this lives apart from the backends: which limits apply, how keys are
named and what is reserved is policy; the backends only count. Every key
starts with a `{tenant}` hash tag (one Redis Cluster slot per tenant). Money is
reserved and settled in integer micro-units (`billing.to_micro_units`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from hydrant.platform.billing import require_money, to_micro_units
from hydrant.platform.quotas.checks import (
    Admission,
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    WindowCheck,
)
from hydrant.platform.quotas.credit_check import CREDIT, CreditStanding, credit_check
from hydrant.platform.quotas.periods import BudgetPeriod, period_window
from hydrant.platform.quotas.policy import KeyQuota, PlanPolicy, ProjectQuota
from hydrant.platform.quotas.tiers import TierDecision

KEY_RATE = "key_rate"
TENANT_RPM = "tenant_rpm"
TENANT_TPM = "tenant_tpm"
CONCURRENCY = "concurrency"
TOKENS_DAY, TOKENS_MONTH = "tokens_day", "tokens_month"
SPEND_DAY, SPEND_MONTH = "spend_day", "spend_month"
# A project's budgets (quotas/policy.py `ProjectQuota`): the same periods, their own names
# and counters, reserved in the same atomic call as the tenant's.
PROJECT_TOKENS_DAY, PROJECT_TOKENS_MONTH = "project_tokens_day", "project_tokens_month"
PROJECT_SPEND_DAY, PROJECT_SPEND_MONTH = "project_spend_day", "project_spend_month"
PROJECT_RPM, PROJECT_TPM = "project_rpm", "project_tpm"
KEY_TOKENS_DAY, KEY_TOKENS_MONTH = "key_tokens_day", "key_tokens_month"
KEY_SPEND_DAY, KEY_SPEND_MONTH = "key_spend_day", "key_spend_month"
_TOKEN_CHECKS = (
    KEY_TOKENS_DAY,
    KEY_TOKENS_MONTH,
    TENANT_TPM,
    TOKENS_DAY,
    TOKENS_MONTH,
    PROJECT_TPM,
    PROJECT_TOKENS_DAY,
    PROJECT_TOKENS_MONTH,
)
_MONEY_CHECKS = (
    SPEND_DAY,
    SPEND_MONTH,
    CREDIT,
    PROJECT_SPEND_DAY,
    PROJECT_SPEND_MONTH,
    KEY_SPEND_DAY,
    KEY_SPEND_MONTH,
)


@dataclass(frozen=True)
class TenantQuota:
    """A tenant's limits from its plan; None means unlimited, 0 means nothing allowed."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    spend_per_day: Decimal | None = None
    spend_per_month: Decimal | None = None

    def __post_init__(self) -> None:
        for name in ("spend_per_day", "spend_per_month"):
            value = getattr(self, name)
            if value is not None and require_money(value, name) < 0:
                raise ValueError(f"{name} must not be negative")

    @classmethod
    def of(cls, plan: PlanPolicy | None) -> TenantQuota:
        """A plan's limits (none without a plan)."""
        if plan is None:
            return cls()
        return cls(
            requests_per_minute=plan.requests_per_minute,
            tokens_per_minute=plan.tokens_per_minute,
            max_concurrent=plan.max_concurrent_requests,
            tokens_per_day=plan.tokens_per_day,
            tokens_per_month=plan.tokens_per_month,
            spend_per_day=plan.spend_per_day,
            spend_per_month=plan.spend_per_month,
        )


def _require_id(value: str, name: str) -> str:
    # Same test as a per-character loop, in C (see `checks._require_name`).
    if value.split() != [value] or "{" in value or "}" in value or ":" in value:
        raise ValueError(f"{name} must be non-empty, without spaces, braces or colons")
    return value


def build_checks(
    *,
    tenant_id: str,
    key_id: str,
    tier: TierDecision,
    quota: TenantQuota,
    reserve_tokens: int,
    reserve_money: Decimal,
    at: datetime,
    lease_s: float = 900.0,
    requests: int = 1,
    credit: CreditStanding | None = None,
    project: ProjectQuota | None = None,
    key_quota: KeyQuota | None = None,
) -> tuple[Check, ...]:
    """The checks for one request, reserving its maximum tokens and cost.

    `requests` is how many prompts the request holds (a batched completion): the per-key
    tier rate counts prompts, since each is a sequence of that size on the device; the
    tenant's requests per minute count the HTTP request once, as OpenAI counts a batch.
    `credit`: a prepaid tenant's standing; its maximum cost is reserved against them.
    `project`: the key's project's rates and budgets; `key_quota`: the key's own budgets; each
    reserved beside the tenant's.
    """
    tag = "{" + _require_id(tenant_id, "tenant_id") + "}"
    _require_id(key_id, "key_id")
    micros = to_micro_units(reserve_money)
    checks: list[Check] = []
    if tier.requests_per_s is not None:
        key = f"{tag}:key:{key_id}:{tier.tier}"
        checks.append(WindowCheck(KEY_RATE, key, tier.requests_per_s, 1.0, requests))
    if quota.requests_per_minute is not None:
        checks.append(WindowCheck(TENANT_RPM, f"{tag}:rpm", quota.requests_per_minute, 60.0))
    if quota.tokens_per_minute is not None:
        checks.append(
            WindowCheck(TENANT_TPM, f"{tag}:tpm", quota.tokens_per_minute, 60.0, reserve_tokens)
        )
    if quota.max_concurrent is not None:
        checks.append(ConcurrencyCheck(CONCURRENCY, f"{tag}:conc", quota.max_concurrent, lease_s))
    checks.extend(budget_checks(tag, quota, reserve_tokens, micros, at, lease_s))
    if project is not None and project.limited:
        checks.extend(project_rate_checks(tag, project, reserve_tokens))
        checks.extend(project_budget_checks(tag, project, reserve_tokens, micros, at, lease_s))
    if key_quota is not None:
        checks.extend(key_budget_checks(tag, key_quota, reserve_tokens, micros, at, lease_s))
    if credit is not None:
        checks.append(credit_check(tag, credit, reserve_money, at, lease_s))
    return tuple(checks)


def key_budget_checks(
    tag: str, key: KeyQuota, reserve_tokens: int, micros: int, at: datetime, lease_s: float
) -> list[BudgetCheck]:
    """A key's own budgets: counters of their own under the tenant's hash tag. A rotated
    key's successor has its own id, so its counters start afresh."""
    day, month = BudgetPeriod.DAY, BudgetPeriod.MONTH
    budgets: list[tuple[str, int | None, int, str, BudgetPeriod]] = [
        (KEY_TOKENS_DAY, key.tokens_per_day, reserve_tokens, "tokens", day),
        (KEY_TOKENS_MONTH, key.tokens_per_month, reserve_tokens, "tokens", month),
        (KEY_SPEND_DAY, _micros(key.spend_per_day), micros, "spend", day),
        (KEY_SPEND_MONTH, _micros(key.spend_per_month), micros, "spend", month),
    ]
    prefix = f"{tag}:keybudget:{_require_id(key.key_id, 'key_id')}"
    return _period_checks(prefix, budgets, at, lease_s)


def _project_prefix(tag: str, project: ProjectQuota) -> str:
    return f"{tag}:project:{_require_id(project.project_id, 'project_id')}"


def project_rate_checks(tag: str, project: ProjectQuota, reserve_tokens: int) -> list[WindowCheck]:
    """A project's requests and tokens per minute: windows of their own, beside the
    tenant's (the HTTP request counts once, as for the tenant's requests per minute)."""
    prefix = _project_prefix(tag, project)
    checks = []
    if project.requests_per_minute is not None:
        checks.append(WindowCheck(PROJECT_RPM, f"{prefix}:rpm", project.requests_per_minute, 60.0))
    if project.tokens_per_minute is not None:
        checks.append(
            WindowCheck(
                PROJECT_TPM, f"{prefix}:tpm", project.tokens_per_minute, 60.0, reserve_tokens
            )
        )
    return checks


def project_budget_checks(
    tag: str,
    project: ProjectQuota,
    reserve_tokens: int,
    micros: int,
    at: datetime,
    lease_s: float,
) -> list[BudgetCheck]:
    """A project's budgets: counters of their own under the tenant's hash tag (one slot)."""
    budgets: list[tuple[str, int | None, int, str, BudgetPeriod]] = [
        (PROJECT_TOKENS_DAY, project.tokens_per_day, reserve_tokens, "tokens", BudgetPeriod.DAY),
        (
            PROJECT_TOKENS_MONTH,
            project.tokens_per_month,
            reserve_tokens,
            "tokens",
            BudgetPeriod.MONTH,
        ),
        (PROJECT_SPEND_DAY, _micros(project.spend_per_day), micros, "spend", BudgetPeriod.DAY),
        (
            PROJECT_SPEND_MONTH,
            _micros(project.spend_per_month),
            micros,
            "spend",
            BudgetPeriod.MONTH,
        ),
    ]
    return _period_checks(_project_prefix(tag, project), budgets, at, lease_s)


def _period_checks(
    prefix: str,
    budgets: list[tuple[str, int | None, int, str, BudgetPeriod]],
    at: datetime,
    lease_s: float,
) -> list[BudgetCheck]:
    checks = []
    for name, limit, amount, unit, period in budgets:
        if limit is None:
            continue
        window = period_window(period, at)
        key = f"{prefix}:{unit}:{period}:{window.label}"
        checks.append(BudgetCheck(name, key, limit, amount, window.end.timestamp(), lease_s))
    return checks


def budget_checks(
    tag: str, quota: TenantQuota, reserve_tokens: int, micros: int, at: datetime, lease_s: float
) -> list[BudgetCheck]:
    budgets: list[tuple[str, int | None, int, str, BudgetPeriod]] = [
        (TOKENS_DAY, quota.tokens_per_day, reserve_tokens, "tokens", BudgetPeriod.DAY),
        (TOKENS_MONTH, quota.tokens_per_month, reserve_tokens, "tokens", BudgetPeriod.MONTH),
        (SPEND_DAY, _micros(quota.spend_per_day), micros, "spend", BudgetPeriod.DAY),
        (SPEND_MONTH, _micros(quota.spend_per_month), micros, "spend", BudgetPeriod.MONTH),
    ]
    return _period_checks(tag, budgets, at, lease_s)


def batch_checks(
    *,
    tenant_id: str,
    quota: TenantQuota,
    reserve_tokens: int,
    reserve_money: Decimal,
    at: datetime,
    lease_s: float,
    credit: CreditStanding | None = None,
    project: ProjectQuota | None = None,
    key_quota: KeyQuota | None = None,
) -> tuple[BudgetCheck, ...]:
    """The checks a Batch API batch reserves at creation: the budgets of its tenant, of its
    key's `project` and of the key itself (`key_quota`), for the batch's maximum tokens and
    cost, leased for its whole window (and, for a prepaid tenant, its `credit`).

    The project's and key's checks are the very ones `build_checks` makes for an
    interactive request (same names, same counters): a key or project with a budget
    would otherwise spend without limit through batches, and a batch and interactive
    requests draw on one budget, whichever comes first.

    Why only budgets: a batch's lines run in capacity left idle, at the lowest priority,
    so the interactive rates (per key, per minute, concurrency; the project's per minute
    too) do not apply to them; the plan's batch queue limit (`batch_queue_tokens`) is
    checked on the database instead. The runner settles each line's share once the line
    is stored (`QuotaBackend.resync`, every check by its name: `budget_amounts`).
    """
    tag = "{" + _require_id(tenant_id, "tenant_id") + "}"
    micros = to_micro_units(reserve_money)
    checks = budget_checks(tag, quota, reserve_tokens, micros, at, lease_s)
    if project is not None:
        checks.extend(project_budget_checks(tag, project, reserve_tokens, micros, at, lease_s))
    if key_quota is not None:
        checks.extend(key_budget_checks(tag, key_quota, reserve_tokens, micros, at, lease_s))
    if credit is not None:
        checks.append(credit_check(tag, credit, reserve_money, at, lease_s))
    return tuple(checks)


def _micros(value: Decimal | None) -> int | None:
    return None if value is None else to_micro_units(value)


def settle_amounts(admission: Admission, *, tokens: int, money: Decimal) -> dict[str, int]:
    """The `actual` mapping for `QuotaBackend.settle`, for the checks this admission holds."""
    return budget_amounts(admission, tokens=tokens, micros=to_micro_units(money))


def budget_amounts(admission: Admission, *, tokens: int, micros: int) -> dict[str, int]:
    """Per check this admission holds: `tokens` for a token limit, `micros` for a money one."""
    amounts: dict[str, int] = {}
    for check in admission.checks:
        if check.name in _TOKEN_CHECKS:
            amounts[check.name] = tokens
        elif check.name in _MONEY_CHECKS:
            amounts[check.name] = micros
    return amounts
