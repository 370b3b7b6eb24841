"""Plans: the rules for creating and changing them.

Plans are not tenant data (every tenant may be on any plan), so only admins
reach this service. A plan change takes effect for every tenant on it within
the auth cache TTL; the node that makes the change drops its cache at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.invalidation import CacheInvalidator, no_cache
from hydrant.platform.db.models import DEFAULT_PLAN_ID, DEFAULT_PLAN_NAME, Plan
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound
from hydrant.platform.prices.decimal_text import parse_decimal
from hydrant.platform.tenants import repository
from hydrant.platform.tenants.schemas import PlanCreate, PlanUpdate, changes

_MONEY_FIELDS = ("spend_per_day", "spend_per_month")
_COPIED_FIELDS = (
    "name",
    "free_below_tokens",
    "limited_up_to_tokens",
    "limited_requests_per_s",
    "long_queue_timeout_s",
    "max_prompt_tokens",
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent_requests",
    "tokens_per_day",
    "tokens_per_month",
    "batch_queue_tokens",
    "prepaid",
)


def _weight(value: object) -> Decimal:
    text = str(value) if isinstance(value, float) else value
    if not isinstance(text, str | int):
        raise InvalidRequest("fair_share_weight must be a number", param="fair_share_weight")
    return parse_decimal(text, param="fair_share_weight", places=4, integer_digits=6, positive=True)


def _models(names: Sequence[str] | None) -> list[str] | None:
    if names is None:
        return None
    cleaned = [name.strip() for name in names]
    if any(not name for name in cleaned):
        raise InvalidRequest("allowed_models must not contain empty names", param="allowed_models")
    return sorted(set(cleaned))


def _column_values(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Request fields turned into column values, each checked on its own."""
    values: dict[str, Any] = {name: fields[name] for name in _COPIED_FIELDS if name in fields}
    if "name" in values:
        values["name"] = values["name"].strip()
        if not values["name"]:
            raise InvalidRequest("name must not be blank", param="name")
    for name in _MONEY_FIELDS:
        if name in fields:
            raw = fields[name]
            values[name] = (
                None if raw is None else parse_decimal(raw, param=name, places=6, integer_digits=14)
            )
    if "fair_share_weight" in fields:
        values["fair_share_weight"] = _weight(fields["fair_share_weight"])
    if "allowed_models" in fields:
        values["allowed_models"] = _models(fields["allowed_models"])
    return values


def _check_tiers(plan: Plan) -> None:
    if plan.free_below_tokens > plan.limited_up_to_tokens:
        raise InvalidRequest(
            "free_below_tokens must not exceed limited_up_to_tokens", param="free_below_tokens"
        )


class PlanService:
    def __init__(self, session: AsyncSession, *, cache: CacheInvalidator = no_cache) -> None:
        self._session = session
        self._cache = cache

    async def create(self, body: PlanCreate) -> Plan:
        values = _column_values({name: getattr(body, name) for name in body.__struct_fields__})
        plan = Plan(**values)
        _check_tiers(plan)
        await self._unique_name(plan.name, other_than=None)
        self._session.add(plan)
        await self._flush()
        return plan

    async def get(self, plan_id: str) -> Plan:
        plan = await repository.get_plan(self._session, plan_id)
        if plan is None:
            raise NotFound(f"no plan {plan_id!r}", param="plan_id")
        return plan

    async def resolve(self, ref: str | None) -> Plan:
        """The plan named or identified by `ref`; the default plan when `ref` is None."""
        if ref is None:
            return await self.default()
        plan = await repository.find_plan(self._session, ref)
        if plan is None:
            raise NotFound(f"no plan {ref!r}", param="plan")
        return plan

    async def default(self) -> Plan:
        """The default plan (made by the migration; recreated here if it was removed)."""
        plan = await repository.get_plan(self._session, DEFAULT_PLAN_ID)
        if plan is None:
            plan = Plan(id=DEFAULT_PLAN_ID, name=DEFAULT_PLAN_NAME)
            self._session.add(plan)
            await self._flush()
        return plan

    async def list(self, *, limit: int, after: str | None) -> tuple[Sequence[Plan], bool]:
        return await repository.list_plans(self._session, limit=limit, after=after)

    async def update(self, plan_id: str, body: PlanUpdate) -> Plan:
        plan = await self.get(plan_id)
        values = _column_values(changes(body))
        if "name" in values:
            await self._unique_name(values["name"], other_than=plan.id)
        for name, value in values.items():
            setattr(plan, name, value)
        _check_tiers(plan)
        await self._flush()
        self._cache.clear()  # cached principals carry the old limits
        return plan

    async def _unique_name(self, name: str, *, other_than: str | None) -> None:
        if await repository.plan_name_taken(self._session, name, other_than=other_than):
            raise Conflict(f"a plan named {name!r} exists", param="name")

    async def _flush(self) -> None:
        try:
            await self._session.flush()
        except IntegrityError:  # a concurrent insert of the same name won the race
            raise Conflict("the plan conflicts with another one (same name?)") from None
