"""Price and ledger arithmetic: per-entry charges add up to report totals exactly, forever.

Why properties: the rounding rule (round once per entry, half-even, to
micro-units; sum exactly; round the total to cents only for display) has to
hold for every usage and price, not for the handful of examples a unit test
picks; and drift is a property of many entries, so one test sums a million.
"""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime
from decimal import Decimal
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

from hydrant.platform.billing import (
    Price,
    TokenUsage,
    charge_for,
    from_micro_units,
    round_money,
    split_exact,
    to_micro_units,
)
from hydrant.platform.billing.money import MONEY_CONTEXT
from hydrant.platform.reports.repository import AggregateRow
from hydrant.platform.reports.service import ReportTotals

HALF_MICRO = Decimal("0.0000005")

# Published prices per million tokens: up to 6 decimals, up to $200/Mtok.
price_amounts = st.decimals(min_value=0, max_value=200, places=6, allow_nan=False)
prices = st.builds(Price, price_amounts, price_amounts, st.none() | price_amounts)


@st.composite
def usages(draw: st.DrawFn) -> TokenUsage:
    input_tokens = draw(st.integers(0, 200_000))
    cached = draw(st.integers(0, input_tokens))
    return TokenUsage(input_tokens, draw(st.integers(0, 200_000)), cached)


def exact_charge(usage: TokenUsage, price: Price) -> Decimal:
    """The unrounded charge, in a context wide enough that nothing is rounded."""
    ctx = MONEY_CONTEXT
    uncached = usage.input_tokens - usage.cached_input_tokens
    total = (
        uncached * price.input_per_million
        + usage.cached_input_tokens * price.cached_rate
        + usage.output_tokens * price.output_per_million
    )
    return ctx.divide(total, Decimal(1_000_000))


@settings(max_examples=300, deadline=None)
@given(usages(), prices)
def test_a_charge_is_the_exact_price_rounded_once_to_micro_units(
    usage: TokenUsage, price: Price
) -> None:
    charge = charge_for(usage, price)
    assert charge == round_money(charge)  # already at storage precision
    assert abs(charge - exact_charge(usage, price)) <= HALF_MICRO
    assert charge >= 0
    assert from_micro_units(to_micro_units(charge)) == charge


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(usages(), prices, st.sampled_from(["t1", "t2", "t3"])), max_size=60))
def test_report_totals_equal_the_sum_of_entries_however_they_are_grouped(
    entries: list[tuple[TokenUsage, Price, str]],
) -> None:
    charges = [charge_for(usage, price) for usage, price, _ in entries]
    per_entry = sum(charges, Decimal(0))
    # What SQLite sums (integer micro-units) and what PostgreSQL sums (NUMERIC) agree.
    assert from_micro_units(sum(to_micro_units(c) for c in charges)) == per_entry
    groups: dict[str, list[int]] = defaultdict(list)
    for index, (_, _, tenant) in enumerate(entries):
        groups[tenant].append(index)
    rows = [
        _row(tenant, [entries[i][0] for i in idx], [charges[i] for i in idx])
        for tenant, idx in groups.items()
    ]
    totals = ReportTotals.of(rows)
    assert totals.charged == per_entry
    assert totals.requests == len(entries)
    assert totals.input_tokens == sum(u.input_tokens for u, _, _ in entries)
    assert totals.output_tokens == sum(u.output_tokens for u, _, _ in entries)
    # Display rounds the total once; it is within half a cent of the exact sum.
    assert abs(round_money(totals.charged, 2) - per_entry) <= Decimal("0.005")


def _row(tenant: str, entries: list[TokenUsage], charges: list[Decimal]) -> AggregateRow:
    return AggregateRow(
        bucket=datetime(2026, 12, 2, tzinfo=UTC),
        tenant_id=tenant,
        model="demo",
        requests=len(entries),
        input_tokens=sum(u.input_tokens for u in entries),
        cached_tokens=sum(u.cached_input_tokens for u in entries),
        output_tokens=sum(u.output_tokens for u in entries),
        charged=sum(charges, Decimal(0)),
        device_seconds=Decimal(0),
        device_cost=Decimal(0),
    )


@settings(max_examples=300, deadline=None)
@given(
    st.decimals(min_value=0, max_value=10_000, places=6, allow_nan=False),
    st.lists(st.integers(0, 10**9), min_size=1, max_size=40).filter(any),
)
def test_split_shares_sum_to_the_total_and_stay_within_a_micro_unit(
    total: Decimal, weights: list[int]
) -> None:
    shares = split_exact(total, weights)
    assert sum(shares, Decimal(0)) == round_money(total)
    weight_sum = sum(weights)
    for share, weight in zip(shares, weights, strict=True):
        exact = MONEY_CONTEXT.divide(round_money(total) * weight, Decimal(weight_sum))
        assert share >= 0 and abs(share - exact) < Decimal("0.000001")


@cache
def _charge(usage: TokenUsage, price: Price) -> Decimal:
    return charge_for(usage, price)


def test_a_million_entries_sum_exactly_with_no_drift() -> None:
    """A million per-entry charges: the Decimal sum equals the integer micro-unit sum exactly,
    and half-even rounding keeps the summed total within half a cent of the exact unrounded
    amount (a biased rule, e.g. always up, would drift by ~$0.25 here).

    `charge_for` is a pure function of (usage, price); entries draw from 5,000 usage shapes,
    so it is memoised to keep the test to a couple of seconds. The sum itself is over all
    million entries.
    """
    rng = random.Random(20261202)
    price_book = [
        Price(Decimal("0.15"), Decimal("0.60"), Decimal("0.075")),
        Price(Decimal("0.10"), Decimal("0.40"), Decimal("0.05")),
        Price(Decimal("3.00"), Decimal("15.00"), Decimal("0.30")),
        Price(Decimal("0.013"), Decimal("0.037")),
    ]
    shapes = []
    for _ in range(5_000):
        input_tokens = rng.randint(1, 4096)
        shapes.append(TokenUsage(input_tokens, rng.randint(0, 2048), rng.randint(0, input_tokens)))
    n = 1_000_000
    entries = [(shapes[rng.randrange(5_000)], price_book[rng.randrange(4)]) for _ in range(n)]
    charges = [_charge(usage, price) for usage, price in entries]

    decimal_sum = MONEY_CONTEXT.create_decimal(0)
    for charge in charges:
        decimal_sum += charge
    micros = {charge: to_micro_units(charge) for charge in set(charges)}
    micro_sum = sum(micros[charge] for charge in charges)
    assert decimal_sum == from_micro_units(micro_sum)

    # The exact amount, summed per price over token totals (no rounding anywhere).
    tokens: dict[Price, list[int]] = defaultdict(lambda: [0, 0, 0])
    for usage, price in entries:
        bucket = tokens[price]
        bucket[0] += usage.input_tokens - usage.cached_input_tokens
        bucket[1] += usage.cached_input_tokens
        bucket[2] += usage.output_tokens
    exact = sum(
        (
            MONEY_CONTEXT.divide(
                u * p.input_per_million + c * p.cached_rate + o * p.output_per_million,
                Decimal(1_000_000),
            )
            for p, (u, c, o) in tokens.items()
        ),
        Decimal(0),
    )
    drift = decimal_sum - exact
    assert abs(drift) <= n * HALF_MICRO  # the hard bound of rounding each entry once
    assert abs(drift) < Decimal("0.005"), drift  # and no bias: under half a cent
    assert round_money(decimal_sum, 2) - round_money(exact, 2) in (
        Decimal("-0.01"),
        Decimal("0.00"),
        Decimal("0.01"),
    )
