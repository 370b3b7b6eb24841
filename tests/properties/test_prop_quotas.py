"""Quota arithmetic under any interleaving of reserve (admit), settle, refund and time passing.

Why a state machine against a model: the promises are about interleavings
(requests reserving their maximum, settling to less, being refunded, windows
sliding and budget periods rolling over while others are in flight). The model
is the plain arithmetic of each limit; after every step the store must agree
with it, admit exactly when the model has room, never hold a negative amount,
and never let what was admitted exceed a limit.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, multiple, rule
from redis import Redis

from hydrant.platform.quotas import (
    Admission,
    BudgetCheck,
    ConcurrencyCheck,
    InMemoryQuotaBackend,
    QuotaBackend,
    QuotaExceeded,
    WindowCheck,
)
from hydrant.platform.quotas.periods import BudgetPeriod, period_window

WINDOW_S = 10.0
TPM, CONC, BUDGET = 40, 3, 60
START = datetime(2026, 12, 31, 23, 59, 0, tzinfo=UTC).timestamp()  # day AND month roll soon


@dataclass
class Clock:
    now: float = START

    def __call__(self) -> float:
        return self.now


@dataclass
class Model:
    """The arithmetic the store must do: what is in each limit right now."""

    window: dict[str, tuple[float, int]] = field(default_factory=dict)  # rid -> (ts, amount)
    slots: set[str] = field(default_factory=set)
    spent: dict[str, int] = field(default_factory=dict)  # budget key -> settled amount
    reserved: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> rid -> amount

    def window_total(self, now: float) -> int:
        return sum(a for ts, a in self.window.values() if ts > now - WINDOW_S)

    def budget_taken(self, key: str) -> int:
        return self.spent.get(key, 0) + sum(self.reserved.get(key, {}).values())


class QuotaMachine(RuleBasedStateMachine):
    """A tokens-per-window limit, a concurrency limit and a daily budget, checked together."""

    in_flight = Bundle("in_flight")
    settled = Bundle("settled")

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.runner = asyncio.Runner()
        self.prefix = f"test:qprop:{uuid.uuid4().hex}"
        self.backend: QuotaBackend = self.runner.run(self.make_backend())
        self.model = Model()

    async def make_backend(self) -> QuotaBackend:
        return InMemoryQuotaBackend(clock=self.clock)

    def budget_key(self) -> str:
        label = period_window(BudgetPeriod.DAY, datetime.fromtimestamp(self.clock.now, UTC)).label
        return f"{{t}}:tokens:day:{label}"

    def checks(self, tokens: int) -> tuple[WindowCheck, ConcurrencyCheck, BudgetCheck]:
        window = period_window(BudgetPeriod.DAY, datetime.fromtimestamp(self.clock.now, UTC))
        return (
            WindowCheck("tpm", "{t}:tpm", TPM, WINDOW_S, tokens),
            ConcurrencyCheck("conc", "{t}:conc", CONC, lease_s=10**7),
            BudgetCheck(
                "day", self.budget_key(), BUDGET, tokens, window.end.timestamp(), lease_s=10**7
            ),
        )

    @rule(target=in_flight, tokens=st.integers(0, 30))
    def reserve(self, tokens: int) -> object:
        now, key, model = self.clock.now, self.budget_key(), self.model
        fits = (
            model.window_total(now) + tokens <= TPM
            and len(model.slots) + 1 <= CONC
            and model.budget_taken(key) + tokens <= BUDGET
        )
        try:
            admission = self.runner.run(self.backend.admit(self.checks(tokens)))
        except QuotaExceeded as refused:
            assert not fits, "refused although every limit had room"
            assert all(r.retry_after_s is None or r.retry_after_s > 0 for r in refused.refusals)
            return multiple()
        assert fits, "admitted past a limit"
        rid = admission.reservation_id
        model.window[rid] = (now, tokens)
        model.slots.add(rid)
        model.reserved.setdefault(key, {})[rid] = tokens
        # What was admitted never exceeds a limit at the moment of admission.
        assert model.window_total(now) <= TPM and len(model.slots) <= CONC
        assert model.budget_taken(key) <= BUDGET
        return admission

    @rule(target=settled, admission=consumes(in_flight), share=st.sampled_from([0, 0.5, 1, 1.5]))
    def settle(self, admission: Admission, share: float) -> Admission:
        """Settle to the actual use: nothing (a refund), part, all, or more than reserved."""
        window, _, budget = admission.checks
        assert isinstance(window, WindowCheck) and isinstance(budget, BudgetCheck)
        actual = int(budget.amount * share)
        self.runner.run(self.backend.settle(admission, {"tpm": actual, "day": actual}))
        rid, model = admission.reservation_id, self.model
        if rid in model.window:
            ts, _ = model.window[rid]
            if ts > self.clock.now - WINDOW_S:
                model.window[rid] = (ts, actual)
        model.slots.discard(rid)
        model.reserved[budget.key].pop(rid)
        model.spent[budget.key] = model.spent.get(budget.key, 0) + actual
        return admission

    @rule(admission=settled)
    def settle_again(self, admission: Admission) -> None:
        """A second settle (a retry after a timeout) changes nothing."""
        self.runner.run(self.backend.settle(admission, {"tpm": 0, "day": 0}))

    @rule(seconds=st.sampled_from([0.25, 1.0, 3.0, 9.75, 10.0, 30.0, 3600.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @invariant()
    def store_agrees_with_the_model(self) -> None:
        now, model = self.clock.now, self.model
        window, conc, budget = self.checks(0)
        used = self.runner.run(self.backend.usage(window))
        assert used.used == model.window_total(now) and used.used >= 0
        assert self.runner.run(self.backend.usage(conc)).used == len(model.slots)
        for key in {budget.key, *model.spent, *model.reserved}:
            if key != budget.key and not model.reserved.get(key):
                continue  # an ended period holding nothing: the store may drop it
            check = BudgetCheck("day", key, BUDGET, 0, budget.period_end)
            usage = self.runner.run(self.backend.usage(check))
            assert usage.used == model.spent.get(key, 0) and usage.used >= 0
            assert usage.reserved == sum(model.reserved.get(key, {}).values())
            assert usage.reserved >= 0

    @invariant()
    def a_new_period_starts_from_zero(self) -> None:
        key = self.budget_key()
        if key not in self.model.spent and key not in self.model.reserved:
            _, _, budget = self.checks(0)
            assert self.runner.run(self.backend.usage(budget)).used == 0

    def teardown(self) -> None:
        try:
            self.runner.run(self.cleanup())
        finally:
            self.runner.close()

    async def cleanup(self) -> None:
        await self.backend.aclose()


QuotaMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestMemoryQuotas = QuotaMachine.TestCase


class RedisQuotaMachine(QuotaMachine):
    """The same machine against the Redis store: both stores must make the same decisions."""

    redis_url = ""

    async def make_backend(self) -> QuotaBackend:
        from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

        return RedisQuotaBackend.from_url(self.redis_url, key_prefix=self.prefix, clock=self.clock)

    async def cleanup(self) -> None:
        await self.backend.aclose()
        with Redis.from_url(self.redis_url) as client:
            keys = list(client.scan_iter(match=f"{self.prefix}*"))
            if keys:
                client.delete(*keys)


@pytest.mark.integration
def test_redis_store_keeps_the_same_arithmetic(redis_url: str) -> None:
    RedisQuotaMachine.redis_url = redis_url
    case = RedisQuotaMachine.TestCase
    case.settings = settings(
        max_examples=25,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    case("runTest").runTest()


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(
        min_value=datetime(2000, 1, 1),
        max_value=datetime(2100, 1, 1),
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=-5)), timezone(timedelta(hours=13))]
        ),
    ),
    st.sampled_from(list(BudgetPeriod)),
)
def test_periods_tile_time_and_roll_over(at: datetime, period: BudgetPeriod) -> None:
    """Each moment is in exactly one period; the next period starts where this one ends,
    under a different label (so its budget key starts from zero)."""
    window = period_window(period, at)
    assert window.start <= at < window.end
    nxt = period_window(period, window.end)
    assert nxt.start == window.end and nxt.label != window.label
    before = period_window(period, window.start - timedelta(microseconds=1))
    assert before.end == window.start and before.label < window.label
    assert period_window(period, window.end - timedelta(microseconds=1)).label == window.label


@pytest.mark.integration
async def test_a_zero_reservation_settles_on_redis(redis_url: str) -> None:
    """Found by the machine above: settling a reservation of 0 (a free model under a spend
    budget) made the Redis script send HINCRBY "-0", which Redis refuses."""
    from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

    prefix = f"test:qzero:{uuid.uuid4().hex}"
    store = RedisQuotaBackend.from_url(redis_url, key_prefix=prefix)
    budget = BudgetCheck("spend", "{t}:spend", 100, 0, START + 86_400)
    try:
        admission = await store.admit([budget])
        await store.settle(admission, {"spend": 0})
        assert (await store.usage(budget)).used == 0
        assert (await store.usage(budget)).reserved == 0
    finally:
        await store.aclose()
        with Redis.from_url(redis_url) as cleaner:
            keys = list(cleaner.scan_iter(match=f"{prefix}*"))
            if keys:
                cleaner.delete(*keys)
