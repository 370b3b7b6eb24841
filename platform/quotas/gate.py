"""The `Gatekeeper` of the request path: length tiers, the long lane, limits and budgets.

Order matters: a request that can never be served (prompt too long) is a
422 before anything is counted; a long request waits for a place in its
model's long lane before it takes any rate or budget; budgets reserve the
request's maximum cost and settle to its actual cost, so concurrent requests
cannot overspend.

A Batch API line (`ctx.batch`) takes the model's batch lane instead (batch_lane.py):
no interactive rate applies to it, its budget was reserved when its batch was made,
and its batch's runner settles its share of that reservation once the line is stored.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from hydrant.platform.billing.money import round_money
from hydrant.platform.billing.pricing import Price, TokenUsage, charge_for, price_of
from hydrant.platform.errors import (
    BudgetExhausted,
    InsufficientQuota,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    Unprocessable,
)
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.quotas import Admission as QuotaAdmission
from hydrant.platform.quotas import (
    LimitKind,
    QuotaBackend,
    QuotaBackendUnavailable,
    QuotaExceeded,
    RequestTooLargeError,
    TenantQuota,
    Tier,
    TierDecision,
    TierPolicy,
    build_checks,
    classify,
    settle_amounts,
)
from hydrant.platform.quotas.admission import Admission, BatchTicket, Prepared, RequestContext
from hydrant.platform.quotas.batch_lane import BatchLane
from hydrant.platform.quotas.credit_check import (
    CREDIT,
    NO_CREDITS,
    CreditSource,
    CreditStanding,
)
from hydrant.platform.quotas.ingest_order import leave_ingest_gate
from hydrant.platform.quotas.rate_headers import rate_limit_headers

log = logging.getLogger(__name__)

# A credit refusal with a wait this short is one where only reservations block the request.
CREDIT_HELD_RETRY_S = 60.0

PriceLookup = Callable[[str], Price | None]


class LaneFull(Exception):
    pass


class LongLane:
    """A bounded FIFO queue in front of a model's long requests: at most `slots` prompts run
    at once.

    A batched request holds one place per prompt (at most all of them), granted together, so
    two half-admitted batches can never hold each other's places. Places go in arrival order:
    a batch waiting for several places is not overtaken by single prompts behind it.
    """

    def __init__(self, slots: int, max_waiting: int) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self._free = slots
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def weight(self, prompts: int) -> int:
        return max(1, min(prompts, self.slots))

    async def enter(self, timeout_s: float, prompts: int = 1) -> None:
        need = self.weight(prompts)
        if not self._queue and self._free >= need:
            self._free -= need
            return
        if len(self._queue) >= self.max_waiting:
            raise LaneFull
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (need, granted)
        self._queue.append(entry)
        try:
            # Not `asyncio.wait_for`: on Python 3.11 it loses a cancellation that comes in
            # the step the place is granted (the request would run for a client who left).
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(granted)
        except BaseException:
            if granted.done():  # granted as the wait ended: give the places back
                self._free += need
            else:
                self._queue.remove(entry)
                granted.cancel()
            self._grant()
            raise

    def leave(self, prompts: int = 1) -> None:
        self._free += self.weight(prompts)
        self._grant()

    def _grant(self) -> None:
        while self._queue and self._queue[0][0] <= self._free:
            need, granted = self._queue.popleft()
            self._free -= need
            granted.set_result(None)


def _money(outcome: Outcome, price: Price | None) -> Decimal:
    if price is None:
        return Decimal(0)
    usage = outcome.usage
    return charge_for(
        TokenUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cached_input_tokens=usage.cached_tokens,
        ),
        price,
    )


@dataclass
class _Settlement:
    backend: QuotaBackend
    admission: QuotaAdmission | None
    lane: LongLane | None
    price: Price | None
    prompts: int = 1
    batch_lane: BatchLane | None = None  # the model's, told when an interactive request ends
    rate_limit_headers: Mapping[str, str] = field(default_factory=dict)

    def close(self) -> None:
        """The batch lane hears of the end only now, not at `settle`: the response still
        waits for its ledger entry, and batch lines let go at once (each storing its result
        in a transaction) would queue that write behind theirs (issue #27)."""
        lane, self.batch_lane = self.batch_lane, None  # once
        if lane is not None:
            lane.interactive_ended()

    async def settle(self, outcome: Outcome) -> None:
        try:
            if self.admission is not None and self.admission.metered:
                usage = outcome.usage
                actual = settle_amounts(
                    self.admission,
                    tokens=usage.prompt_tokens + usage.completion_tokens,
                    money=_money(outcome, self.price),
                )
                await self.backend.settle(self.admission, actual)
        finally:
            if self.lane is not None:
                self.lane.leave(self.prompts)


@dataclass
class _LineSettlement:
    """A batch line's end: its place in the batch lane freed. Its budget share is the
    runner's to settle, once the line is stored (`BatchRunner`, `QuotaBackend.resync`):
    a line cut off before it is stored runs again, and must not count twice."""

    ticket: BatchTicket
    lane: BatchLane
    rate_limit_headers: Mapping[str, str] = field(default_factory=dict)  # no rate applies

    async def settle(self, outcome: Outcome) -> None:
        self.lane.leave()

    def close(self) -> None:
        return None


def format_money(value: Decimal) -> str:
    return f"{round_money(value):f}"


def _insufficient(
    standing: CreditStanding,
    cost: Decimal,
    retry_after_s: float | None,
    headers: Mapping[str, str],
) -> InsufficientQuota:
    """OpenAI's refusal for an account out of credit, naming the balance. A retry helps
    only when requests in flight hold the credit (a short retry-after then): a request
    the balance itself cannot cover waits for a top-up, so it gets none."""
    held = retry_after_s is not None and retry_after_s <= CREDIT_HELD_RETRY_S
    message = (
        f"You exceeded your current quota: your prepaid balance is "
        f"{format_money(standing.balance)} {standing.currency} and this request could cost up "
        f"to {format_money(cost)} {standing.currency}"
    )
    if held:
        message += " (part of the balance is held by requests in progress; retry shortly)"
    else:
        message += "; add credits to continue"
    return InsufficientQuota(
        message, retry_after=retry_after_s if held else None, headers=dict(headers)
    )


def _quota(ctx: RequestContext) -> tuple[TierPolicy, TenantQuota]:
    plan = ctx.plan
    return (plan.tiers if plan is not None else TierPolicy()), TenantQuota.of(plan)


_LIMIT_WORDS = {
    "key_rate": "requests per second for this API key at this request size",
    "tenant_rpm": "requests per minute for your organization",
    "tenant_tpm": "tokens per minute for your organization",
    "concurrency": "concurrent requests for your organization",
    "tokens_day": "daily token budget",
    "tokens_month": "monthly token budget",
    "spend_day": "daily spend budget",
    "spend_month": "monthly spend budget",
    "key_tokens_day": "daily token budget of this API key",
    "key_tokens_month": "monthly token budget of this API key",
    "key_spend_day": "daily spend budget of this API key",
    "key_spend_month": "monthly spend budget of this API key",
    "project_rpm": "requests per minute for this key's project",
    "project_tpm": "tokens per minute for this key's project",
    "project_tokens_day": "daily token budget of this key's project",
    "project_tokens_month": "monthly token budget of this key's project",
    "project_spend_day": "daily spend budget of this key's project",
    "project_spend_month": "monthly spend budget of this key's project",
}


class QuotaGate:
    def __init__(
        self,
        backend: QuotaBackend,
        prices: PriceLookup,
        *,
        long_lane_slots: int = 2,
        long_lane_queue: int = 64,
        batch_lane_slots: int = 8,
        batch_lane_busy_slots: int = 0,
        on_refusal: Callable[[str, str], None] | None = None,
        on_lane_wait: Callable[[str, float], None] | None = None,
        on_store_admit: Callable[[float], None] | None = None,
        credit_source: CreditSource | None = None,
    ) -> None:
        self.backend = backend
        self.prices = prices
        self.credit_source = credit_source  # None: a prepaid plan's tenant has no credits
        self._lanes: dict[str, LongLane] = {}
        self._lane_slots = long_lane_slots
        self._lane_queue = long_lane_queue
        self._batch_lanes: dict[str, BatchLane] = {}
        self._batch_slots = (batch_lane_slots, batch_lane_busy_slots)
        self._refused = on_refusal or (lambda tenant, reason: None)
        self._lane_waited = on_lane_wait or (lambda model, seconds: None)
        self._store_admitted = on_store_admit or (lambda seconds: None)  # the store's answer, timed

    def lane(self, model: str) -> LongLane:
        if model not in self._lanes:
            self._lanes[model] = LongLane(self._lane_slots, self._lane_queue)
        return self._lanes[model]

    def batch_lane(self, model: str) -> BatchLane:
        if model not in self._batch_lanes:
            self._batch_lanes[model] = BatchLane(*self._batch_slots)
        return self._batch_lanes[model]

    async def quiet(self, model: str) -> None:
        """Until `model` has no interactive request in flight (see `BatchLane.quiet`)."""
        await self.batch_lane(model).quiet()

    async def admit(self, ctx: RequestContext) -> Admission:
        def refused(reason: str) -> None:
            self._refused(ctx.tenant_id, reason)

        policy, quota = _quota(ctx)
        tier = self._tier(ctx.prepared, policy, ctx.max_model_len, refused)
        if ctx.batch is not None:
            lane = self.batch_lane(ctx.model)
            await lane.enter()
            return _LineSettlement(ctx.batch, lane)
        settlement = await self._admit_interactive(ctx, policy, quota, tier, refused)
        settlement.batch_lane = self.batch_lane(ctx.model)
        settlement.batch_lane.interactive_started()
        return settlement

    async def _admit_interactive(
        self,
        ctx: RequestContext,
        policy: TierPolicy,
        quota: TenantQuota,
        tier: TierDecision,
        refused: Callable[[str], None],
    ) -> _Settlement:
        prepared = ctx.prepared
        prompts = len(prepared.prompts)
        if tier.requests_per_s is not None and prompts > tier.requests_per_s:
            refused("batch_over_key_rate")
            raise InvalidRequest(
                f"{prompts} prompts of this size ({tier.total_tokens} tokens with max_tokens) "
                f"exceed this key's limit of {tier.requests_per_s} such prompts per second; "
                f"send at most {tier.requests_per_s} per request",
                param="prompt",
                code="batch_too_large",
            )
        output_tokens = sum(p.sampling.max_tokens * p.sampling.n for p in prepared.prompts)
        reserve_tokens = prepared.prompt_tokens + output_tokens
        price = price_of(self.prices, ctx.model, ctx.adapter)
        reserve = Decimal(0)
        if price is not None:
            reserve = charge_for(
                TokenUsage(input_tokens=prepared.prompt_tokens, output_tokens=output_tokens),
                price,
            )
        lane = None
        if tier.tier is Tier.LONG:
            lane = self.lane(ctx.model)
            leave_ingest_gate()  # the lane may wait for seconds: not in the gateway's way
            waited_from = time.monotonic()
            try:
                await lane.enter(tier.queue_timeout_s or policy.long_queue_timeout_s, prompts)
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
        standing: CreditStanding | None = None
        try:
            if ctx.plan is not None and ctx.plan.prepaid:
                standing = NO_CREDITS
                if self.credit_source is not None:
                    standing = await self.credit_source.standing(ctx.tenant_id)
            checks = build_checks(
                tenant_id=ctx.tenant_id,
                key_id=ctx.api_key_id or "none",
                tier=tier,
                quota=quota,
                reserve_tokens=reserve_tokens,
                reserve_money=reserve,
                requests=prompts,
                at=ctx.started_at,
                credit=standing,
                project=ctx.project,
                key_quota=ctx.key_quota,
            )
            admission = None
            if checks:
                asked_at = time.perf_counter()
                try:
                    admission = await self.backend.admit(checks)
                finally:  # a refusal waited for its answer too
                    self._store_admitted(time.perf_counter() - asked_at)
            if standing is not None and admission is not None and not admission.metered:
                # The store is down and the policy is to fail open: a prepaid tenant is
                # still never served unmetered (its balance is a hard stop).
                raise QuotaBackendUnavailable("credits cannot be reserved")
        except QuotaExceeded as exc:
            if lane is not None:
                lane.leave(prompts)
            refusal = next((r for r in exc.refusals if r.limit_name == CREDIT), exc.refusal)
            refused(refusal.limit_name)
            words = _LIMIT_WORDS.get(refusal.limit_name, refusal.limit_name)
            headers = rate_limit_headers(exc.windows, refusal.limit_name, refusal.retry_after_s)
            if refusal.limit_name == CREDIT and standing is not None:
                if self.credit_source is not None:
                    self.credit_source.forget(ctx.tenant_id)
                raise _insufficient(standing, reserve, refusal.retry_after_s, headers) from exc
            if refusal.kind is LimitKind.BUDGET:
                raise BudgetExhausted(
                    f"{words} exhausted ({refusal.limit_name}); it renews with its period",
                    code=refusal.limit_name,
                    retry_after=refusal.retry_after_s,
                    headers=headers,
                ) from exc
            raise RateLimited(
                f"rate limit reached: {words} (limit {refusal.limit})",
                code=refusal.limit_name,
                retry_after=refusal.retry_after_s,
                headers=headers,
            ) from exc
        except QuotaBackendUnavailable as exc:
            if lane is not None:
                lane.leave(prompts)
            refused("quota_backend_unavailable")
            raise ServiceUnavailable(
                "the quota service is unavailable; requests are refused until it recovers",
                code="quota_unavailable",
                retry_after=2,
            ) from exc
        except BaseException:
            if lane is not None:  # e.g. the credits could not be read: the place goes back
                lane.leave(prompts)
            raise
        headers = rate_limit_headers(admission.windows) if admission is not None else {}
        return _Settlement(
            self.backend, admission, lane, price, prompts, rate_limit_headers=headers
        )

    def _tier(
        self,
        prepared: Prepared,
        policy: TierPolicy,
        model_context: int | None,
        refused: Callable[[str], None],
    ) -> TierDecision:
        """The tier of the request's largest prompt: each prompt is its own sequence on the
        device, so a batch is as long as its longest member, and counts once per prompt."""
        largest: TierDecision | None = None
        for prompt in prepared.prompts:
            sampling = prompt.sampling
            try:
                tier = classify(
                    len(prompt.token_ids), sampling.max_tokens, policy, model_context=model_context
                )
            except RequestTooLargeError as exc:
                refused(exc.reason)
                raise Unprocessable(
                    f"{exc}; shorten the prompt or lower max_tokens",
                    param=prepared.prompt_field
                    if exc.reason == "prompt_too_long"
                    else "max_tokens",
                    code="context_length_exceeded",
                ) from exc
            if largest is None or tier.total_tokens > largest.total_tokens:
                largest = tier
        assert largest is not None  # a prepared request has at least one prompt
        return largest
