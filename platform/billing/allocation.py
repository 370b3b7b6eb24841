"""Splitting one amount into shares that add up to it exactly (largest remainder method).

Why: a batch step's device cost is shared by the requests in the batch in
proportion to their tokens. Rounding each share on its own would make the
shares sum to a little more or less than the step's cost, and that drift would
show up as money nobody was charged (or charged twice) in the reports. Here the
remainder micro-units go to the largest fractional parts, so the shares always
sum to the rounded total.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from hydrant.platform.billing.money import (
    MONEY_CONTEXT,
    STORAGE_PLACES,
    require_money,
    round_money,
)


def split_exact(
    total: Decimal, weights: Sequence[int], places: int = STORAGE_PLACES
) -> list[Decimal]:
    """Shares of `round_money(total, places)` proportional to `weights`, summing to it exactly
    (in units of the last place: micro-units by default, cents for a report's figures)."""
    if require_money(total, "total") < 0:
        raise ValueError("total must not be negative")
    if not weights:
        raise ValueError("weights must not be empty")
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            raise ValueError("weights must be non-negative ints")
    weight_sum = sum(weights)
    if weight_sum == 0:
        raise ValueError("at least one weight must be positive")
    micros = int(round_money(total, places).scaleb(places, context=MONEY_CONTEXT))
    base = [micros * w // weight_sum for w in weights]
    leftover = micros - sum(base)
    # Largest fractional remainder first; ties go to the earlier index (deterministic).
    order = sorted(range(len(weights)), key=lambda i: (-(micros * weights[i] % weight_sum), i))
    for index in order[:leftover]:
        base[index] += 1
    return [Decimal(share).scaleb(-places, context=MONEY_CONTEXT) for share in base]
