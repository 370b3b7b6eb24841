"""Token charges, device cost and exact splits, with property tests for sums and drift."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hydrant.platform.billing import (
    REPORT_PLACES,
    DevicePrice,
    Price,
    TokenUsage,
    charge_for,
    device_cost,
    round_money,
    seconds_from_ns,
    split_exact,
)

D = Decimal
PRICE = Price(
    input_per_million=D("0.50"), output_per_million=D("1.50"), cached_input_per_million=D("0.25")
)

prices = st.decimals(min_value=0, max_value=1000, places=4, allow_nan=False, allow_infinity=False)
counts = st.integers(min_value=0, max_value=2_000_000)


@st.composite
def usages(draw: st.DrawFn) -> TokenUsage:
    input_tokens = draw(counts)
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=draw(counts),
        cached_input_tokens=draw(st.integers(min_value=0, max_value=input_tokens)),
    )


def test_charge_splits_cached_from_uncached_input() -> None:
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=2_000_000, cached_input_tokens=400_000)
    # 600k × 0.50 + 400k × 0.25 + 2M × 1.50, per million
    assert charge_for(usage, PRICE) == D("3.400000")


def test_one_token_is_charged_in_micro_units() -> None:
    assert charge_for(TokenUsage(input_tokens=1, output_tokens=1), PRICE) == D("0.000002")


def test_cached_price_defaults_to_input_price() -> None:
    price = Price(input_per_million=D(2), output_per_million=D(0))
    usage = TokenUsage(input_tokens=500_000, output_tokens=0, cached_input_tokens=500_000)
    assert charge_for(usage, price) == D("1.000000")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"input_per_million": 0.5, "output_per_million": D(1)},
        {"input_per_million": D(1), "output_per_million": D(1), "cached_input_per_million": 0.1},
    ],
)
def test_float_prices_are_a_type_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        Price(**cast(Any, kwargs))


def test_negative_price_and_bad_usage_are_refused() -> None:
    with pytest.raises(ValueError):
        Price(input_per_million=D(-1), output_per_million=D(1))
    with pytest.raises(ValueError, match="cached"):
        TokenUsage(input_tokens=1, output_tokens=0, cached_input_tokens=2)
    with pytest.raises(TypeError):
        TokenUsage(input_tokens=cast(Any, 1.0), output_tokens=0)
    with pytest.raises(ValueError):
        TokenUsage(input_tokens=-1, output_tokens=0)


@given(usages(), prices, prices, prices)
def test_charge_equals_exact_value_rounded_once(
    usage: TokenUsage, p_in: Decimal, p_out: Decimal, p_cached: Decimal
) -> None:
    price = Price(
        input_per_million=p_in, output_per_million=p_out, cached_input_per_million=p_cached
    )
    exact = (
        D(usage.input_tokens - usage.cached_input_tokens) * p_in
        + D(usage.cached_input_tokens) * p_cached
        + D(usage.output_tokens) * p_out
    ) / D(1_000_000)
    charge = charge_for(usage, price)
    assert abs(charge - exact) <= D("0.0000005")
    assert charge == round_money(charge)
    assert charge >= 0


@given(usages(), usages(), prices, prices)
def test_charge_is_monotone_in_tokens(
    a: TokenUsage, b: TokenUsage, p_in: Decimal, p_out: Decimal
) -> None:
    price = Price(input_per_million=p_in, output_per_million=p_out)
    both = TokenUsage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
    )
    assert charge_for(both, price) >= charge_for(
        TokenUsage(input_tokens=a.input_tokens, output_tokens=a.output_tokens), price
    )


@settings(max_examples=50)
@given(st.lists(st.tuples(usages(), prices, prices), min_size=1, max_size=300), st.randoms())
def test_stored_charges_sum_exactly_in_any_grouping(
    entries: list[tuple[TokenUsage, Decimal, Decimal]], rnd: random.Random
) -> None:
    """Rollups add stored charges and never re-round: day → month equals the direct sum."""
    charges = [
        charge_for(u, Price(input_per_million=pi, output_per_million=po)) for u, pi, po in entries
    ]
    direct = sum(charges, D(0))
    shuffled = list(charges)
    rnd.shuffle(shuffled)
    days = [sum(shuffled[i : i + 7], D(0)) for i in range(0, len(shuffled), 7)]
    assert sum(days, D(0)) == direct
    assert direct == round_money(direct)  # a sum of 6-place values is already at 6 places


@settings(max_examples=50)
@given(st.lists(st.decimals(min_value=0, max_value=10, places=9), min_size=1, max_size=2000))
def test_drift_of_per_entry_rounding_is_bounded(raw: list[Decimal]) -> None:
    """Documented bound: |Σ round(x) − Σ x| ≤ n/2 micro-units; the report rounds the total."""
    stored_total = sum((round_money(x) for x in raw), D(0))
    exact_total = sum(raw, D(0))
    assert abs(stored_total - exact_total) <= D("0.0000005") * len(raw)
    report = round_money(stored_total, REPORT_PLACES)
    assert abs(report - stored_total) <= D("0.005")


def test_no_drift_for_repeated_exact_charges() -> None:
    charge = charge_for(TokenUsage(input_tokens=333, output_tokens=77), PRICE)
    assert sum([charge] * 100_000, D(0)) == charge * 100_000


def test_device_cost_from_nanoseconds() -> None:
    price = DevicePrice(per_hour=D("3.60"))
    assert seconds_from_ns(1_500_000_000) == D("1.5")
    assert device_cost(D("1.5"), price) == D("0.001500")
    assert device_cost(seconds_from_ns(1), price) == D("0.000000")
    assert device_cost(D(3600), price) == D("3.600000")


def test_device_cost_refuses_floats_and_negatives() -> None:
    with pytest.raises(TypeError):
        device_cost(cast(Any, 1.5), DevicePrice(per_hour=D(1)))
    with pytest.raises(TypeError):
        DevicePrice(per_hour=cast(Any, 2.0))
    with pytest.raises(ValueError):
        device_cost(D(-1), DevicePrice(per_hour=D(1)))
    with pytest.raises(TypeError):
        seconds_from_ns(cast(Any, 1.0))


@given(
    st.integers(min_value=0, max_value=10**12),
    st.decimals(min_value=0, max_value=100, places=4),
)
def test_device_cost_is_close_to_exact(nanos: int, per_hour: Decimal) -> None:
    exact = D(nanos) / D(10**9) * per_hour / D(3600)
    assert abs(device_cost(seconds_from_ns(nanos), DevicePrice(per_hour=per_hour)) - exact) <= D(
        "0.0000005000001"
    )


@given(
    st.decimals(min_value=0, max_value=10**6, places=6),
    st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=64).filter(any),
)
def test_split_sums_exactly_and_each_share_is_within_one_micro(
    total: Decimal, weights: list[int]
) -> None:
    shares = split_exact(total, weights)
    assert sum(shares, D(0)) == round_money(total)
    weight_sum = sum(weights)
    for share, weight in zip(shares, weights, strict=True):
        assert abs(share - total * weight / weight_sum) < D("0.000001")
        if weight == 0:
            assert share == 0


def test_split_ties_are_deterministic() -> None:
    assert split_exact(D("0.000002"), [1, 1, 1]) == [D("0.000001"), D("0.000001"), D(0)]


@pytest.mark.parametrize(
    ("total", "weights"), [(D(1), []), (D(1), [0, 0]), (D(-1), [1]), (D(1), [1, -1])]
)
def test_split_refuses_bad_input(total: Decimal, weights: list[int]) -> None:
    with pytest.raises(ValueError):
        split_exact(total, weights)


def test_a_batch_price_is_half_the_interactive_one_unless_set() -> None:
    from hydrant.platform.billing.pricing import batch_price

    interactive = Price(
        input_per_million=Decimal("0.15"),
        output_per_million=Decimal("0.6"),
        cached_input_per_million=Decimal("0.05"),
    )
    half = batch_price(interactive)
    assert (half.input_per_million, half.cached_rate, half.output_per_million) == (
        Decimal("0.075"),
        Decimal("0.025"),
        Decimal("0.30"),
    )
    assert batch_price(
        interactive, output_per_million=Decimal("0.5")
    ).output_per_million == Decimal("0.5")
    usage = TokenUsage(input_tokens=1_000_000, output_tokens=1_000_000)
    assert charge_for(usage, half) * 2 == charge_for(usage, interactive)
