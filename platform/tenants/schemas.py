"""Bodies of the tenants and plans admin API (and the tenant's own `/account`).

Admin bodies forbid unknown fields: a misspelt limit in an admin request is a
400, not a silently unlimited plan. In updates a field left out is unchanged
and `null` clears it (for limits, `null` means unlimited).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from hydrant.platform.db.models import Plan, Tenant
from hydrant.platform.prices.decimal_text import DecimalText, format_decimal

Name = Annotated[str, Meta(min_length=1, max_length=200)]
PlanName = Annotated[str, Meta(min_length=1, max_length=100)]
Positive = Annotated[int, Meta(ge=1, le=2**31 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**31 - 1)]
BigCount = Annotated[int, Meta(ge=0, le=2**62)]
ModelNames = Annotated[
    list[Annotated[str, Meta(min_length=1, max_length=200)]], Meta(max_length=1000)
]
Weight = DecimalText | float


class PlanCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: PlanName
    free_below_tokens: Positive = 512
    limited_up_to_tokens: Positive = 2048
    limited_requests_per_s: Positive = 10
    long_queue_timeout_s: Positive = 30
    max_prompt_tokens: Positive = 8192
    requests_per_minute: Count | None = None
    tokens_per_minute: BigCount | None = None
    max_concurrent_requests: Count | None = None
    tokens_per_day: BigCount | None = None
    tokens_per_month: BigCount | None = None
    spend_per_day: DecimalText | None = None
    spend_per_month: DecimalText | None = None
    fair_share_weight: Weight = "1"
    allowed_models: ModelNames | None = None
    batch_queue_tokens: BigCount | None = None
    prepaid: bool = False  # admitted only against the tenant's credits (platform/credits)


class PlanUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: PlanName | UnsetType = UNSET
    free_below_tokens: Positive | UnsetType = UNSET
    limited_up_to_tokens: Positive | UnsetType = UNSET
    limited_requests_per_s: Positive | UnsetType = UNSET
    long_queue_timeout_s: Positive | UnsetType = UNSET
    max_prompt_tokens: Positive | UnsetType = UNSET
    requests_per_minute: Count | UnsetType | None = UNSET
    tokens_per_minute: BigCount | UnsetType | None = UNSET
    max_concurrent_requests: Count | UnsetType | None = UNSET
    tokens_per_day: BigCount | UnsetType | None = UNSET
    tokens_per_month: BigCount | UnsetType | None = UNSET
    spend_per_day: DecimalText | UnsetType | None = UNSET
    spend_per_month: DecimalText | UnsetType | None = UNSET
    fair_share_weight: Weight | UnsetType = UNSET
    allowed_models: ModelNames | UnsetType | None = UNSET
    batch_queue_tokens: BigCount | UnsetType | None = UNSET
    prepaid: bool | UnsetType = UNSET


class PlanView(Struct, kw_only=True):
    id: str
    object: Literal["plan"] = "plan"
    name: str
    free_below_tokens: int
    limited_up_to_tokens: int
    limited_requests_per_s: int
    long_queue_timeout_s: int
    max_prompt_tokens: int
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrent_requests: int | None
    tokens_per_day: int | None
    tokens_per_month: int | None
    spend_per_day: str | None
    spend_per_month: str | None
    fair_share_weight: str
    allowed_models: list[str] | None
    batch_queue_tokens: int | None
    prepaid: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, plan: Plan) -> PlanView:
        def money(value: Decimal | None) -> str | None:
            return None if value is None else format_decimal(value)

        return cls(
            id=plan.id,
            name=plan.name,
            free_below_tokens=plan.free_below_tokens,
            limited_up_to_tokens=plan.limited_up_to_tokens,
            limited_requests_per_s=plan.limited_requests_per_s,
            long_queue_timeout_s=plan.long_queue_timeout_s,
            max_prompt_tokens=plan.max_prompt_tokens,
            requests_per_minute=plan.requests_per_minute,
            tokens_per_minute=plan.tokens_per_minute,
            max_concurrent_requests=plan.max_concurrent_requests,
            tokens_per_day=plan.tokens_per_day,
            tokens_per_month=plan.tokens_per_month,
            spend_per_day=money(plan.spend_per_day),
            spend_per_month=money(plan.spend_per_month),
            fair_share_weight=format_decimal(plan.fair_share_weight, 1),
            allowed_models=plan.allowed_models,
            batch_queue_tokens=plan.batch_queue_tokens,
            prepaid=plan.prepaid,
            created_at=plan.created_at,
            updated_at=plan.updated_at,
        )


class PlanList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[PlanView]
    has_more: bool


class TenantCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name
    contact_email: Annotated[str, Meta(max_length=320)] | None = None
    timezone: Annotated[str, Meta(max_length=64)] = "UTC"
    plan: str | None = None  # a plan id or name; the default plan when omitted


class TenantUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name | UnsetType = UNSET
    contact_email: Annotated[str, Meta(max_length=320)] | UnsetType | None = UNSET
    timezone: Annotated[str, Meta(max_length=64)] | UnsetType = UNSET
    plan: str | UnsetType = UNSET


class TenantView(Struct, kw_only=True):
    id: str
    object: Literal["tenant"] = "tenant"
    name: str
    status: str
    contact_email: str | None
    timezone: str
    plan_id: str | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, tenant: Tenant) -> TenantView:
        return cls(
            id=tenant.id,
            name=tenant.name,
            status=tenant.status,
            contact_email=tenant.contact_email,
            timezone=tenant.timezone,
            plan_id=tenant.plan_id,
            created_at=tenant.created_at,
            updated_at=tenant.updated_at,
        )


class TenantList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[TenantView]
    has_more: bool


class AccountView(Struct, kw_only=True):
    """What a tenant sees of itself: its record and the plan it is on."""

    object: Literal["account"] = "account"
    tenant: TenantView
    plan: PlanView


def changes(update: Struct) -> dict[str, object]:
    """The fields an update body sets (`null` included), by name."""
    return {
        name: value
        for name in update.__struct_fields__
        if (value := getattr(update, name)) is not UNSET
    }
