"""Which grants pay a charge: promo first, then soonest-expiring, exactly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from hydrant.platform.credits.allocation import GrantFunds, allocate, spending_order

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def funds(
    gid: str, kind: str, left: str, expires_in_days: float | None = None, age_days: float = 1
) -> GrantFunds:
    expiry = None if expires_in_days is None else NOW + timedelta(days=expires_in_days)
    return GrantFunds(gid, kind, Decimal(left), expiry, NOW - timedelta(days=age_days))


def test_promo_then_soonest_expiring_then_oldest() -> None:
    grants = [
        funds("paid_forever", "paid", "5"),
        funds("paid_soon", "paid", "5", expires_in_days=3),
        funds("paid_later", "paid", "5", expires_in_days=30),
        funds("promo_forever", "promo", "5"),
        funds("promo_soon", "promo", "5", expires_in_days=10),
        funds("paid_forever_older", "paid", "5", age_days=9),
    ]
    order = [g.grant_id for g in spending_order(grants)]
    assert order == [
        "promo_soon",
        "promo_forever",
        "paid_soon",
        "paid_later",
        "paid_forever_older",
        "paid_forever",
    ]


def test_a_charge_is_split_exactly_and_what_no_grant_covers_is_unpaid() -> None:
    grants = [
        funds("promo", "promo", "0.000003"),
        funds("paid", "paid", "1.5", expires_in_days=2),
        funds("expired", "promo", "100", expires_in_days=-1),
        funds("empty", "promo", "0"),
    ]
    split = allocate(Decimal("0.700001"), grants, NOW)
    assert split.parts == (("promo", Decimal("0.000003")), ("paid", Decimal("0.699998")))
    assert split.unpaid == 0
    over = allocate(Decimal("2"), grants, NOW)
    assert sum(a for _, a in over.parts) + over.unpaid == Decimal("2")
    assert over.unpaid == Decimal("0.499997")
    assert allocate(Decimal(0), grants, NOW).parts == ()


def test_an_entry_finished_before_expiry_is_paid_by_that_grant() -> None:
    grants = [funds("soon", "paid", "1", expires_in_days=1)]
    assert allocate(Decimal("0.5"), grants, NOW).unpaid == 0
    assert allocate(Decimal("0.5"), grants, NOW + timedelta(days=2)).unpaid == Decimal("0.5")


def test_floats_and_negative_charges_are_refused() -> None:
    with pytest.raises(TypeError):
        allocate(0.5, [], NOW)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        allocate(Decimal(-1), [], NOW)
