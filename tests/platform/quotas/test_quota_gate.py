"""The request path's gate: tiers at their boundaries, the long lane, limits, budgets, outages.

Runs the real `QuotaGate` over the in-memory backend and, for the outage,
a real Redis client pointed at a closed port (fail closed by default).
"""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from hydrant.engine.protocol import RequestUsage, Sampling
from hydrant.platform.billing.pricing import Price
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import (
    BudgetExhausted,
    InsufficientQuota,
    InvalidRequest,
    RateLimited,
    ServiceUnavailable,
    Unprocessable,
)
from hydrant.platform.inference.params import PreparedPrompt, PreparedRequest
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.quotas import (
    GuardedQuotaBackend,
    InMemoryQuotaBackend,
    LimitUsage,
    TierPolicy,
)
from hydrant.platform.quotas.admission import BatchTicket, RequestContext
from hydrant.platform.quotas.credit_check import CreditStanding
from hydrant.platform.quotas.gate import QuotaGate
from hydrant.platform.quotas.plan import TenantQuota, batch_checks
from hydrant.platform.quotas.policy import PlanPolicy
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

PRICE = Price(input_per_million=Decimal("1"), output_per_million=Decimal("2"))


def plan(**overrides: object) -> PlanPolicy:
    values: dict[str, object] = {
        "plan_id": "pln_test",
        "name": "test",
        "tiers": TierPolicy(long_queue_timeout_s=0.2),
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "max_concurrent_requests": None,
        "tokens_per_day": None,
        "tokens_per_month": None,
        "spend_per_day": None,
        "spend_per_month": None,
        "fair_share_weight": Decimal(1),
        "allowed_models": None,
    }
    values.update(overrides)
    return PlanPolicy(**values)  # type: ignore[arg-type]


def ctx(
    prompt: int,
    max_tokens: int,
    policy: PlanPolicy | None = None,
    key: str = "k1",
    prompts: int = 1,
    adapter: str | None = None,
) -> RequestContext:
    """A request of `prompts` prompts (a batched completion) of `prompt` tokens each, on
    the base model `demo` or one of its LoRA adapters."""
    one = PreparedPrompt([1] * prompt, Sampling(max_tokens=max_tokens))
    return RequestContext(
        request_id="req_x",
        tenant_id="ten_a",
        api_key_id=key,
        key_prefix="hyd_test_abc",
        model="demo",
        prepared=PreparedRequest((one,) * prompts, stream=False, include_usage=False),
        plan=policy or plan(),
        max_model_len=100_000,
        adapter=adapter,
    )


def outcome(prompt: int, completion: int) -> Outcome:
    return Outcome(
        status="finished",
        usage=RequestUsage(
            prompt_tokens=prompt, cached_tokens=0, completion_tokens=completion, device_ns=0
        ),
        finished_at=utcnow(),
    )


def gate(**kwargs: object) -> QuotaGate:
    return QuotaGate(GuardedQuotaBackend(InMemoryQuotaBackend()), lambda _: PRICE, **kwargs)  # type: ignore[arg-type]


async def test_free_tier_has_no_per_key_rate() -> None:
    g = gate()
    for _ in range(50):
        admission = await g.admit(ctx(300, 211))  # 511 tokens: free-flowing
        await admission.settle(outcome(300, 10))


@pytest.mark.parametrize("size", [512, 2048])
async def test_limited_tier_allows_ten_per_second_per_key(size: int) -> None:
    g = gate()
    for _ in range(10):
        await g.admit(ctx(size - 100, 100))
    with pytest.raises(RateLimited) as refused:
        await g.admit(ctx(size - 100, 100))
    assert refused.value.retry_after is not None and refused.value.retry_after > 0
    assert "requests per second" in refused.value.message
    await g.admit(ctx(size - 100, 100, key="k2"))  # another key has its own rate


async def test_prompt_over_the_limit_is_422() -> None:
    g = gate()
    await g.admit(ctx(8192, 1, plan(tiers=TierPolicy(max_prompt_tokens=8192))))
    with pytest.raises(Unprocessable):
        await g.admit(ctx(8193, 1))


async def test_long_lane_queues_and_drops_after_its_timeout() -> None:
    g = gate(long_lane_slots=1, long_lane_queue=4)
    first = await g.admit(ctx(2000, 49))  # 2049 tokens: the long lane
    with pytest.raises(RateLimited) as dropped:
        await g.admit(ctx(2000, 49))
    assert dropped.value.code == "long_lane_timeout"
    waiter = asyncio.create_task(g.admit(ctx(2000, 100)))
    await asyncio.sleep(0.05)
    await first.settle(outcome(2000, 49))
    second = await asyncio.wait_for(waiter, 1)
    await second.settle(outcome(2000, 1))


async def test_long_lane_bound_refuses_at_once() -> None:
    g = gate(long_lane_slots=1, long_lane_queue=1)
    await g.admit(ctx(2000, 100))
    waiter = asyncio.create_task(g.admit(ctx(2000, 100)))
    await asyncio.sleep(0.02)
    with pytest.raises(RateLimited) as full:
        await g.admit(ctx(2000, 100))
    assert full.value.code == "long_lane_full"
    with pytest.raises(RateLimited):
        await waiter


async def test_budget_reserves_the_maximum_and_settles_to_the_actual() -> None:
    # spend budget 0.001: each request reserves (100 in + 400 out) -> 0.0009
    g = gate()
    policy = plan(spend_per_day=Decimal("0.001"))
    first = await g.admit(ctx(100, 400, policy))
    with pytest.raises(BudgetExhausted) as refused:
        await g.admit(ctx(100, 400, policy))
    assert refused.value.type == "insufficient_quota"
    assert "daily spend budget" in refused.value.message
    await first.settle(outcome(100, 0))  # actual cost 0.0001: the rest is given back
    second = await g.admit(ctx(100, 400, policy))
    await second.settle(outcome(100, 400))


async def test_an_adapter_s_requests_reserve_and_settle_at_its_price() -> None:
    """A LoRA adapter's request takes the tenant's budget at the adapter's own price (else
    its base model's): reserved so before it runs, and settled so after (#28)."""
    prices = {
        "demo": PRICE,  # 1 / 2 per million
        "demo:sql": Price(input_per_million=Decimal("10"), output_per_million=Decimal("20")),
    }
    g = QuotaGate(GuardedQuotaBackend(InMemoryQuotaBackend()), prices.get)
    policy = plan(spend_per_day=Decimal("0.005"))
    # 100 in + 400 out: 0.0009 at the base model's price, 0.009 at demo:sql's
    with pytest.raises(BudgetExhausted):
        await g.admit(ctx(100, 400, policy, adapter="sql"))
    sql = await g.admit(ctx(100, 100, policy, adapter="sql"))  # reserves 0.003
    await sql.settle(outcome(100, 100))  # spent 0.003 (0.0003 at the base model's price)
    for _ in range(2):  # an adapter without a price of its own: the base model's, 0.0009
        chat = await g.admit(ctx(100, 400, policy, adapter="chat"))
        await chat.settle(outcome(100, 400))
    # 0.0048 spent: one more at 0.0009 would pass 0.005 (had sql been billed at the base
    # model's price, 0.0021 would be spent and it would pass)
    with pytest.raises(BudgetExhausted):
        await g.admit(ctx(100, 400, policy))


async def test_quota_backend_down_fails_closed() -> None:
    backend = RedisQuotaBackend.from_url("redis://127.0.0.1:1/0", key_prefix="t")
    g = QuotaGate(GuardedQuotaBackend(backend, "closed"), lambda _: PRICE)
    with pytest.raises(ServiceUnavailable) as refused:
        await g.admit(ctx(10, 10, plan(requests_per_minute=100)))
    assert refused.value.retry_after
    await backend.aclose()


class FixedCredits:
    """A `CreditSource` with a set standing."""

    def __init__(self, balance: str) -> None:
        self.value = CreditStanding(Decimal(balance), Decimal(0))
        self.forgotten = 0

    async def standing(self, tenant_id: str) -> CreditStanding:
        return self.value

    def forget(self, tenant_id: str) -> None:
        self.forgotten += 1


async def test_a_prepaid_tenant_is_never_served_unmetered() -> None:
    """Fail open serves a post-paid tenant through a quota outage, never a prepaid one."""
    backend = RedisQuotaBackend.from_url("redis://127.0.0.1:1/0", key_prefix="t")
    g = QuotaGate(
        GuardedQuotaBackend(backend, "open"), lambda _: PRICE, credit_source=FixedCredits("5")
    )
    served = await g.admit(ctx(10, 10, plan(requests_per_minute=100)))
    await served.settle(outcome(10, 10))
    with pytest.raises(ServiceUnavailable):
        await g.admit(ctx(10, 10, plan(requests_per_minute=100, prepaid=True)))
    await backend.aclose()


async def test_credits_bind_at_the_maximum_cost_and_a_refusal_forgets_the_copy() -> None:
    source = FixedCredits("0.001")  # 1000 micro-units
    g = gate(credit_source=source)
    prepaid = plan(prepaid=True)
    held = await g.admit(ctx(100, 200, prepaid))  # at most 100 * 1 + 200 * 2 = 500 micro
    second = await g.admit(ctx(100, 200, prepaid))
    with pytest.raises(InsufficientQuota) as refused:
        await g.admit(ctx(1, 1, prepaid))  # reservations hold it all: retry helps
    assert refused.value.retry_after is not None
    assert "prepaid balance is 0.001000 USD" in refused.value.message
    assert source.forgotten == 1
    await held.settle(outcome(100, 0))  # spent 100 micro-units; 400 given back
    await second.settle(outcome(100, 200))  # spent 500: 400 left
    with pytest.raises(InsufficientQuota) as spent:
        await g.admit(ctx(100, 200, prepaid))  # could cost 500: only a top-up helps
    assert spent.value.retry_after is None
    assert spent.value.code == spent.value.type == "insufficient_quota"
    exact = await g.admit(ctx(100, 150, prepaid))  # could cost exactly the 400 left
    await exact.settle(outcome(100, 150))


def batch(*sizes: tuple[int, int], policy: PlanPolicy | None = None) -> RequestContext:
    """A batched completion of prompts of (prompt, max_tokens) tokens."""
    prompts = tuple(PreparedPrompt([1] * p, Sampling(max_tokens=m)) for p, m in sizes)
    request = ctx(1, 1, policy)
    request.prepared = PreparedRequest(prompts, stream=False, include_usage=False)
    return request


async def test_a_batch_counts_each_prompt_against_the_key_rate() -> None:
    g = gate()
    await g.admit(ctx(900, 100, prompts=4))
    await g.admit(ctx(900, 100, prompts=4))  # 8 of the key's 10 per second
    with pytest.raises(RateLimited) as refused:
        await g.admit(ctx(900, 100, prompts=3))
    assert "requests per second" in refused.value.message
    await g.admit(ctx(900, 100, prompts=2))  # exactly 10


async def test_a_batch_larger_than_the_key_rate_is_refused_with_advice() -> None:
    g = gate()
    with pytest.raises(InvalidRequest) as refused:
        await g.admit(ctx(900, 100, prompts=11))
    assert refused.value.code == "batch_too_large"
    assert "at most 10" in refused.value.message
    await g.admit(ctx(900, 100, prompts=10))  # nothing was taken by the refusal


async def test_a_batch_takes_the_tier_of_its_longest_prompt() -> None:
    g = gate(long_lane_slots=1, long_lane_queue=4)
    await g.admit(batch((10, 10), (2000, 100)))  # one long prompt: the batch is long
    with pytest.raises(RateLimited) as dropped:
        await g.admit(ctx(2000, 100))  # the lane's one place is the batch's
    assert dropped.value.code == "long_lane_timeout"
    with pytest.raises(Unprocessable):
        await g.admit(batch((10, 10), (8193, 1)))


async def test_a_batch_reserves_the_sum_of_its_prompts() -> None:
    # spend budget 0.001: one prompt reserves (100 in + 400 out) -> 0.0009, two 0.0018
    g = gate()
    policy = plan(spend_per_day=Decimal("0.001"))
    with pytest.raises(BudgetExhausted):
        await g.admit(ctx(100, 400, policy, prompts=2))
    admission = await g.admit(ctx(100, 400, policy))
    await admission.settle(outcome(100, 400))


async def test_long_lane_gives_a_batch_its_places_together_and_in_order() -> None:
    g = gate(long_lane_slots=2, long_lane_queue=8)
    single = await g.admit(ctx(2000, 100))  # one of the two places
    big = asyncio.create_task(g.admit(ctx(2000, 100, prompts=5)))  # needs both
    await asyncio.sleep(0.02)
    late = asyncio.create_task(g.admit(ctx(2000, 100)))  # one is free, but the batch is first
    await asyncio.sleep(0.02)
    assert not big.done() and not late.done()
    await single.settle(outcome(2000, 1))
    held = await asyncio.wait_for(big, 1)
    await asyncio.sleep(0.02)
    assert not late.done()  # the batch holds both places
    await held.settle(outcome(10_000, 1))
    await (await asyncio.wait_for(late, 1)).settle(outcome(2000, 1))


def line(policy: PlanPolicy | None = None, ticket: BatchTicket | None = None) -> RequestContext:
    """A Batch API line of 100 prompt tokens and 50 output tokens at most."""
    request = ctx(100, 50, policy)
    request.batch = ticket or BatchTicket(batch_id="batch_x")
    return request


async def test_batch_lines_fill_the_lane_and_give_way_to_interactive_requests() -> None:
    g = gate(batch_lane_slots=2, batch_lane_busy_slots=1)
    first, second = await g.admit(line()), await g.admit(line())
    third = asyncio.create_task(g.admit(line()))
    await asyncio.sleep(0.02)
    assert not third.done()  # both places taken
    interactive = await g.admit(ctx(10, 10))  # never waits for batch lines
    await first.settle(outcome(100, 50))
    await asyncio.sleep(0.02)
    assert not third.done()  # one line still runs: the busy model's one place is taken
    await second.settle(outcome(100, 50))
    await asyncio.wait_for(third, 1)  # now the line gets the busy model's one place
    fourth = asyncio.create_task(g.admit(line()))
    await asyncio.sleep(0.02)
    assert not fourth.done()
    await interactive.settle(outcome(10, 10))
    await asyncio.sleep(0.02)
    assert not fourth.done()  # settled, but its ledger entry is not written yet
    interactive.close()  # idle of interactive requests: all places
    interactive.close()  # once only
    await asyncio.wait_for(fourth, 1)
    lane = g.batch_lane("demo")
    assert (lane.running, lane.interactive) == (2, 0)


async def test_a_batch_line_takes_no_interactive_rate_and_leaves_the_budget_to_its_runner() -> None:
    """The batch's runner settles a line's share once the line is stored (a line cut off
    before that runs again): the gate neither rates a line nor touches the budget."""
    backend = InMemoryQuotaBackend()
    g = QuotaGate(GuardedQuotaBackend(backend), lambda _: PRICE)
    policy = plan(requests_per_minute=1, spend_per_day=Decimal("1"), batch_queue_tokens=10)
    checks = batch_checks(
        tenant_id="ten_a",
        quota=TenantQuota.of(policy),
        reserve_tokens=300,
        reserve_money=Decimal("0.0004"),  # two lines' maxima: 100 in + 50 out at 1/2 per M
        at=utcnow(),
        lease_s=3600,
    )
    await backend.admit(checks)
    for _ in range(2):  # a tenant limited to one request a minute: lines are not requests
        admission = await g.admit(line(policy))
        await admission.settle(outcome(100, 20))
    (spend,) = checks
    assert await backend.usage(spend) == LimitUsage(used=0, reserved=400)


async def test_quiet_waits_for_the_models_interactive_requests_to_end() -> None:
    g = gate()
    await asyncio.wait_for(g.quiet("demo"), 1)  # nothing in flight: at once
    first, second = await g.admit(ctx(10, 10)), await g.admit(ctx(10, 10))
    waiter = asyncio.create_task(g.quiet("demo"))
    await first.settle(outcome(10, 10))
    first.close()
    await asyncio.sleep(0.02)
    assert not waiter.done()  # one still in flight
    await second.settle(outcome(10, 10))
    await asyncio.sleep(0.02)
    assert not waiter.done()  # settled, not closed: its response waits for its ledger entry
    second.close()
    await asyncio.wait_for(waiter, 1)
    await asyncio.wait_for(g.quiet("other"), 1)  # another model's traffic is not waited on


async def test_the_store_s_answer_is_timed_admitted_or_refused_and_not_without_checks() -> None:
    times: list[float] = []
    timed = gate(on_store_admit=times.append)
    limited = plan(requests_per_minute=1)
    admitted = await timed.admit(ctx(10, 10, limited))
    assert len(times) == 1 and times[0] > 0
    with pytest.raises(RateLimited):
        await timed.admit(ctx(10, 10, limited))  # the minute's one request is taken
    assert len(times) == 2 and times[1] > 0  # a refusal waited for its answer too
    await timed.admit(ctx(10, 10))  # no limits: no checks, the store is not asked
    assert len(times) == 2
    await admitted.settle(outcome(10, 10))
