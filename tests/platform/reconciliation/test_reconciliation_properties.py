"""The reconciliation identity, for random worker timelines and random request costs.

Why properties: the identity (held device cost = request + idle + load + drain + asleep
cost, to the cent) and the idle spread (shares add up to the idle cost) must hold for
every timeline: workers that start before the day or run past it, states of any
length down to a microsecond, prices with any number of places, requests that used
more device time than the pool was seen holding. Each property is also checked
against a figure computed another way, so a rule that balanced by accident would fail.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from hydrant.platform.billing import DevicePrice
from hydrant.platform.billing.money import MONEY_CONTEXT
from hydrant.platform.reconciliation.identity import (
    STATE_KIND,
    Interval,
    PoolDay,
    TenantUsage,
    reconcile_pool,
)

DAY_START = datetime(2026, 12, 1, tzinfo=UTC)
DAY_END = DAY_START + timedelta(days=1)
DAY_US = 86_400 * 10**6
CENT = Decimal("0.01")

states = st.sampled_from(sorted(STATE_KIND))
# A segment: a state and how long it lasted (1 µs to 30 h: a state may span the day).
segments = st.lists(
    st.tuples(states, st.integers(min_value=1, max_value=30 * 3600 * 10**6)), min_size=1, max_size=8
)
# A worker: when it started relative to the day (up to a day before, up to a day in).
workers = st.tuples(st.integers(min_value=-DAY_US, max_value=DAY_US), segments)
money6 = st.decimals(min_value=0, max_value=500, places=6, allow_nan=False, allow_infinity=False)
seconds9 = st.decimals(min_value=0, max_value=90_000, places=9, allow_nan=False)
usages = st.lists(
    st.builds(TenantUsage, st.uuids().map(lambda u: f"ten_{u.hex[:8]}"), money6, money6, seconds9),
    max_size=6,
    unique_by=lambda u: u.tenant_id,
)
prices = st.decimals(min_value=0, max_value=100, places=6, allow_nan=False).map(DevicePrice)


def timeline(workers: list[tuple[int, list[tuple[str, int]]]]) -> tuple[list[Interval], int]:
    """The intervals of each worker's contiguous segments, and (computed another way)
    the microseconds each worker's whole life overlaps the day."""
    intervals: list[Interval] = []
    held_us = 0
    for number, (offset, parts) in enumerate(workers):
        moment = DAY_START + timedelta(microseconds=offset)
        first = moment
        for state, length in parts:
            end = moment + timedelta(microseconds=length)
            intervals.append(Interval(f"w{number}", state, moment, end))
            moment = end
        overlap = min(moment, DAY_END) - max(first, DAY_START)
        held_us += max(0, overlap // timedelta(microseconds=1))
    return intervals, held_us


def reconcile(workers: list, usage: list[TenantUsage], price: DevicePrice) -> tuple[PoolDay, int]:
    intervals, held_us = timeline(workers)
    return reconcile_pool("m", intervals, usage, price, DAY_START, DAY_END), held_us


def is_cents(value: Decimal) -> bool:
    return value == value.quantize(CENT)


@settings(max_examples=400, deadline=None)
@given(st.lists(workers, max_size=5), usages, prices)
def test_identity_holds_to_the_cent(
    workers: list, usage: list[TenantUsage], price: DevicePrice
) -> None:
    pool, held_us = reconcile(workers, usage, price)
    figures = (pool.held_cost, pool.request_cost, pool.idle_cost, pool.load_cost)
    assert all(is_cents(f) for f in (*figures, pool.drain_cost, pool.asleep_cost))
    assert pool.held_cost == (
        pool.request_cost + pool.idle_cost + pool.load_cost + pool.drain_cost + pool.asleep_cost
    )
    assert pool.balances
    # Held time is every worker's life inside the day, whatever its states.
    assert pool.held_seconds == Decimal(held_us).scaleb(-6)
    exact_held = MONEY_CONTEXT.divide(
        MONEY_CONTEXT.multiply(pool.held_seconds, price.per_hour), 3600
    )
    assert abs(pool.held_cost - exact_held) <= Decimal("0.005")
    # Idle is the ready time the requests did not use, off by the five roundings at most.
    exact_idle = MONEY_CONTEXT.divide(
        MONEY_CONTEXT.multiply(pool.seconds["ready"], price.per_hour), 3600
    ) - sum((u.device_cost for u in usage), Decimal(0))
    assert abs(pool.idle_cost - exact_idle) <= Decimal("0.025")


@settings(max_examples=400, deadline=None)
@given(st.lists(workers, max_size=5), usages, prices)
def test_spread_idle_costs_sum_to_the_idle_cost(
    workers: list, usage: list[TenantUsage], price: DevicePrice
) -> None:
    pool, _ = reconcile(workers, usage, price)
    shares = [line.idle_cost for line in pool.lines]
    busy = [u.busy_seconds for u in usage]
    if any(busy):
        assert sum(shares, Decimal(0)) == pool.idle_cost
        assert pool.unspread_idle_cost == 0
        total_busy = sum(busy, Decimal(0))
        for share, seconds in zip(shares, busy, strict=True):
            # By share of busy time, within the cent the largest remainder moves.
            exact = MONEY_CONTEXT.divide(
                MONEY_CONTEXT.multiply(pool.idle_cost, seconds), total_busy
            )
            assert abs(share - exact) < CENT
            assert share == 0 or (share > 0) == (pool.idle_cost > 0)
    else:  # nobody used the pool: its idle cost is nobody's to carry
        assert all(share == 0 for share in shares)
        assert pool.unspread_idle_cost == pool.idle_cost
    # The tenants' direct cost adds up to the pool's request cost, and margins follow.
    assert sum((line.device_cost for line in pool.lines), Decimal(0)) == pool.request_cost
    for line in pool.lines:
        assert line.margin == line.revenue - line.device_cost - line.idle_cost


def test_a_known_day() -> None:
    """Two hours loading, ten ready, a dollar of requests at $3.60/h: $43.20 balances."""
    load = Interval("w", "starting", DAY_START, DAY_START + timedelta(hours=2))
    ready = Interval("w", "ready", load.ended_at, load.ended_at + timedelta(hours=10))
    usage = [
        TenantUsage("a", Decimal("5"), Decimal("0.75"), Decimal("750")),
        TenantUsage("b", Decimal("2"), Decimal("0.25"), Decimal("250")),
    ]
    pool = reconcile_pool(
        "m", [load, ready], usage, DevicePrice(Decimal("3.60")), DAY_START, DAY_END
    )
    assert (pool.held_cost, pool.load_cost, pool.request_cost) == (
        Decimal("43.20"),
        Decimal("7.20"),
        Decimal("1.00"),
    )
    assert pool.idle_cost == Decimal("35.00")
    assert [line.idle_cost for line in pool.lines] == [Decimal("26.25"), Decimal("8.75")]
    assert pool.lines[0].margin == Decimal("5.00") - Decimal("0.75") - Decimal("26.25")
    assert pool.utilization == Decimal("0.0231")  # 1000 s busy of 43,200 s held
