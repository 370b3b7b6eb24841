"""A plan as the request path reads it: an immutable snapshot, safe to cache and share.

Why a snapshot and not the ORM row: the auth cache keeps it for a few seconds
across requests and tasks, and a detached row would lazy-load or go stale in
surprising ways. Everything is already in the types quotas and billing use
(`TierPolicy`, ints, Decimal), so the hot path converts nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from hydrant.platform.db.models import ApiKey, Plan, Project
from hydrant.platform.quotas.tiers import TierPolicy


@dataclass(frozen=True)
class PlanPolicy:
    """Limits of one plan; every `None` means unlimited (or, for models, all of them)."""

    plan_id: str
    name: str
    tiers: TierPolicy
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    tokens_per_day: int | None
    tokens_per_month: int | None
    spend_per_day: Decimal | None
    spend_per_month: Decimal | None
    fair_share_weight: Decimal
    allowed_models: frozenset[str] | None
    # Prompt tokens a tenant's unfinished batches of one model may hold (None: unlimited).
    batch_queue_tokens: int | None = None
    # Admitted only against the tenant's prepaid credits (a reservation of its max cost).
    prepaid: bool = False

    @classmethod
    def from_row(cls, plan: Plan) -> PlanPolicy:
        return cls(
            plan_id=plan.id,
            name=plan.name,
            tiers=TierPolicy(
                free_below=plan.free_below_tokens,
                limited_up_to=plan.limited_up_to_tokens,
                limited_requests_per_s=plan.limited_requests_per_s,
                long_queue_timeout_s=float(plan.long_queue_timeout_s),
                max_prompt_tokens=plan.max_prompt_tokens,
            ),
            requests_per_minute=plan.requests_per_minute,
            tokens_per_minute=plan.tokens_per_minute,
            max_concurrent_requests=plan.max_concurrent_requests,
            tokens_per_day=plan.tokens_per_day,
            tokens_per_month=plan.tokens_per_month,
            spend_per_day=plan.spend_per_day,
            spend_per_month=plan.spend_per_month,
            fair_share_weight=Decimal(plan.fair_share_weight),
            allowed_models=(
                frozenset(plan.allowed_models) if plan.allowed_models is not None else None
            ),
            batch_queue_tokens=plan.batch_queue_tokens,
            prepaid=bool(plan.prepaid),
        )

    def allows_model(self, name: str) -> bool:
        return self.allowed_models is None or name in self.allowed_models


@dataclass(frozen=True)
class ProjectQuota:
    """A project's rates and budgets (migration 0016), a snapshot like `PlanPolicy`;
    None: none.

    They are checked beside the plan's tenant limits in the same atomic call, so a
    request passes only if every limit that applies has room: the strictest wins.
    """

    project_id: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    spend_per_day: Decimal | None = None
    spend_per_month: Decimal | None = None

    @classmethod
    def from_row(cls, project: Project) -> ProjectQuota:
        return cls(
            project_id=project.id,
            requests_per_minute=project.requests_per_minute,
            tokens_per_minute=project.tokens_per_minute,
            tokens_per_day=project.tokens_per_day,
            tokens_per_month=project.tokens_per_month,
            spend_per_day=project.spend_per_day,
            spend_per_month=project.spend_per_month,
        )

    @property
    def limited(self) -> bool:
        return any(
            value is not None
            for value in (
                self.requests_per_minute,
                self.tokens_per_minute,
                self.tokens_per_day,
                self.tokens_per_month,
                self.spend_per_day,
                self.spend_per_month,
            )
        )


@dataclass(frozen=True)
class KeyQuota:
    """A key's own budgets (migration 0016), checked beside its project's and tenant's."""

    key_id: str
    tokens_per_day: int | None = None
    tokens_per_month: int | None = None
    spend_per_day: Decimal | None = None
    spend_per_month: Decimal | None = None

    @classmethod
    def of(cls, key: ApiKey) -> KeyQuota | None:
        """The key's budgets; None when it sets none (the hot path then checks nothing)."""
        quota = cls(
            key_id=key.id,
            tokens_per_day=key.tokens_per_day,
            tokens_per_month=key.tokens_per_month,
            spend_per_day=key.spend_per_day,
            spend_per_month=key.spend_per_month,
        )
        limits = (quota.tokens_per_day, quota.tokens_per_month)
        money = (quota.spend_per_day, quota.spend_per_month)
        return quota if any(v is not None for v in (*limits, *money)) else None
