"""How the pages write money: rounded once, never a negative zero."""

from __future__ import annotations

from decimal import Decimal

from hydrant.web.rendering import money


def test_money_rounds_once_and_never_shows_negative_zero() -> None:
    assert money(Decimal("-0.000004")) == "0.00"  # a margin that rounds away
    assert money(Decimal("-0.006")) == "-0.01"  # a real loss keeps its sign
    assert money(Decimal("1234.5")) == "1,234.50"
    assert money(None) == "—"
