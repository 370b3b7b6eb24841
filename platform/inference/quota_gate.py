"""The `Gatekeeper` of the request path: length tiers, the long lane, limits and budgets.

Order matters: a request that can never be served (prompt too long) is a
422 before anything is counted; a long request waits for a place in its
model's long lane before it takes any rate or budget; budgets reserve the
request's maximum cost and settle to its actual cost, so concurrent requests
cannot overspend.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from hydrant.platform.billing.pricing import Price, TokenUsage, charge_for
from hydrant.platform.errors import BudgetExhausted, RateLimited, ServiceUnavailable, Unprocessable
from hydrant.platform.inference.accounting import Admission, Outcome, RequestContext
from hydrant.platform.quotas import Admission as QuotaAdmission
from hydrant.platform.quotas import (
    LimitKind,
    QuotaBackend,
    QuotaBackendUnavailable,
    QuotaExceeded,
    RequestTooLargeError,
    TenantQuota,
    Tier,
    TierPolicy,
    build_checks,
    classify,
    settle_amounts,
)

log = logging.getLogger(__name__)

PriceLookup = Callable[[str], Price | None]


class LaneFull(Exception):
    pass


class LongLane:
    """A bounded queue in front of a model's long requests: at most `slots` run at once."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self.max_waiting = max_waiting
        self.waiting = 0

    async def enter(self, timeout_s: float) -> None:
        if self.waiting >= self.max_waiting:
            raise LaneFull
        self.waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout_s)
        finally:
            self.waiting -= 1

    def leave(self) -> None:
        self._slots.release()


@dataclass
class _Settlement:
    backend: QuotaBackend
    admission: QuotaAdmission | None
    lane: LongLane | None
    price: Price | None

    async def settle(self, outcome: Outcome) -> None:
        try:
            if self.admission is not None and self.admission.metered:
                usage = outcome.usage
                money = Decimal(0)
                if self.price is not None:
                    money = charge_for(
                        TokenUsage(
                            input_tokens=usage.prompt_tokens,
                            output_tokens=usage.completion_tokens,
                            cached_input_tokens=usage.cached_tokens,
                        ),
                        self.price,
                    )
                actual = settle_amounts(
                    self.admission,
                    tokens=usage.prompt_tokens + usage.completion_tokens,
                    money=money,
                )
                await self.backend.settle(self.admission, actual)
        finally:
            if self.lane is not None:
                self.lane.leave()


def _quota(ctx: RequestContext) -> tuple[TierPolicy, TenantQuota]:
    plan = ctx.plan
    if plan is None:
        return TierPolicy(), TenantQuota()
    return plan.tiers, TenantQuota(
        requests_per_minute=plan.requests_per_minute,
        tokens_per_minute=plan.tokens_per_minute,
        max_concurrent=plan.max_concurrent_requests,
        tokens_per_day=plan.tokens_per_day,
        tokens_per_month=plan.tokens_per_month,
        spend_per_day=plan.spend_per_day,
        spend_per_month=plan.spend_per_month,
    )


_LIMIT_WORDS = {
    "key_rate": "requests per second for this API key at this request size",
    "tenant_rpm": "requests per minute for your organization",
    "tenant_tpm": "tokens per minute for your organization",
    "concurrency": "concurrent requests for your organization",
    "tokens_day": "daily token budget",
    "tokens_month": "monthly token budget",
    "spend_day": "daily spend budget",
    "spend_month": "monthly spend budget",
}


class QuotaGate:
    def __init__(
        self,
        backend: QuotaBackend,
        prices: PriceLookup,
        *,
        long_lane_slots: int = 2,
        long_lane_queue: int = 64,
        on_refusal: Callable[[str, str], None] | None = None,
        on_lane_wait: Callable[[str, float], None] | None = None,
    ) -> None:
        self.backend = backend
        self.prices = prices
        self._lanes: dict[str, LongLane] = {}
        self._lane_slots = long_lane_slots
        self._lane_queue = long_lane_queue
        self._refused = on_refusal or (lambda tenant, reason: None)
        self._lane_waited = on_lane_wait or (lambda model, seconds: None)

    def lane(self, model: str) -> LongLane:
        if model not in self._lanes:
            self._lanes[model] = LongLane(self._lane_slots, self._lane_queue)
        return self._lanes[model]

    async def admit(self, ctx: RequestContext) -> Admission:
        def refused(reason: str) -> None:
            self._refused(ctx.tenant_id, reason)

        policy, quota = _quota(ctx)
        sampling = ctx.prepared.sampling
        prompt = len(ctx.prepared.prompt_token_ids)
        try:
            tier = classify(prompt, sampling.max_tokens, policy, model_context=ctx.max_model_len)
        except RequestTooLargeError as exc:
            refused(exc.reason)
            raise Unprocessable(
                f"{exc}; shorten the prompt or lower max_tokens",
                param="messages" if exc.reason == "prompt_too_long" else "max_tokens",
                code="context_length_exceeded",
            ) from exc
        price = self.prices(ctx.model)
        reserve = Decimal(0)
        if price is not None:
            reserve = charge_for(
                TokenUsage(input_tokens=prompt, output_tokens=sampling.max_tokens * sampling.n),
                price,
            )
        lane = None
        if tier.tier is Tier.LONG:
            lane = self.lane(ctx.model)
            waited_from = time.monotonic()
            try:
                await lane.enter(tier.queue_timeout_s or policy.long_queue_timeout_s)
                self._lane_waited(ctx.model, time.monotonic() - waited_from)
            except LaneFull:
                refused("long_lane_full")
                raise RateLimited(
                    "the long-request lane of this model is full; retry later",
                    code="long_lane_full",
                    retry_after=5,
                ) from None
            except TimeoutError:
                refused("long_lane_timeout")
                raise RateLimited(
                    f"the request ({tier.total_tokens} tokens) waited "
                    f"{policy.long_queue_timeout_s:g} s in the long-request lane and was dropped",
                    code="long_lane_timeout",
                    retry_after=policy.long_queue_timeout_s,
                ) from None
        checks = build_checks(
            tenant_id=ctx.tenant_id,
            key_id=ctx.api_key_id or "none",
            tier=tier,
            quota=quota,
            reserve_tokens=prompt + sampling.max_tokens * sampling.n,
            reserve_money=reserve,
            at=ctx.started_at,
        )
        try:
            admission = await self.backend.admit(checks) if checks else None
        except QuotaExceeded as exc:
            if lane is not None:
                lane.leave()
            refusal = exc.refusal
            refused(refusal.limit_name)
            words = _LIMIT_WORDS.get(refusal.limit_name, refusal.limit_name)
            if refusal.kind is LimitKind.BUDGET:
                raise BudgetExhausted(
                    f"{words} exhausted ({refusal.limit_name}); it renews with its period",
                    code=refusal.limit_name,
                    retry_after=refusal.retry_after_s,
                ) from exc
            raise RateLimited(
                f"rate limit reached: {words} (limit {refusal.limit})",
                code=refusal.limit_name,
                retry_after=refusal.retry_after_s,
            ) from exc
        except QuotaBackendUnavailable as exc:
            if lane is not None:
                lane.leave()
            refused("quota_backend_unavailable")
            raise ServiceUnavailable(
                "the quota service is unavailable; requests are refused until it recovers",
                code="quota_unavailable",
                retry_after=2,
            ) from exc
        return _Settlement(self.backend, admission, lane, price)
