"""The one rounding rule, micro-units, and the refusal of floats."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrant.platform.billing import (
    REPORT_PLACES,
    from_micro_units,
    require_money,
    round_money,
    to_micro_units,
)

D = Decimal


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0000005", "0.000000"),  # tie goes to the even neighbour
        ("0.0000015", "0.000002"),
        ("0.0000025", "0.000002"),
        ("0.00000051", "0.000001"),
        ("1.2345674999", "1.234567"),
        ("-0.0000015", "-0.000002"),
        ("3", "3.000000"),
    ],
)
def test_round_money_is_half_even_at_six_places(value: str, expected: str) -> None:
    result = round_money(D(value))
    assert result == D(expected)
    assert result.as_tuple().exponent == -6


def test_report_rounding_uses_the_same_function_at_two_places() -> None:
    assert round_money(D("0.125"), REPORT_PLACES) == D("0.12")
    assert round_money(D("0.135"), REPORT_PLACES) == D("0.14")
    assert str(round_money(D("7"), REPORT_PLACES)) == "7.00"


@pytest.mark.parametrize("bad", [0.1, 1e-6, True, "0.1", None])
def test_non_decimal_money_is_a_type_error(bad: object) -> None:
    with pytest.raises(TypeError):
        round_money(cast(Any, bad))
    with pytest.raises(TypeError):
        require_money(bad)


@pytest.mark.parametrize("bad", [D("NaN"), D("Infinity"), D("-Infinity")])
def test_non_finite_money_is_refused(bad: Decimal) -> None:
    with pytest.raises(ValueError, match="finite"):
        round_money(bad)


def test_places_outside_storage_precision_are_refused() -> None:
    with pytest.raises(ValueError):
        round_money(D(1), 7)


def test_micro_units_round_trip_exactly() -> None:
    assert to_micro_units(D("12.345678")) == 12_345_678
    assert to_micro_units(D("0.0000005")) == 0
    assert from_micro_units(12_345_678) == D("12.345678")
    with pytest.raises(TypeError):
        from_micro_units(cast(Any, 1.0))


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_micro_units_are_a_bijection(micros: int) -> None:
    assert to_micro_units(from_micro_units(micros)) == micros


@given(st.decimals(allow_nan=False, allow_infinity=False, places=9, min_value=-(10**9)))
def test_rounding_error_is_at_most_half_a_micro_unit(value: Decimal) -> None:
    assert abs(round_money(value) - value) <= D("0.0000005")
    assert round_money(round_money(value)) == round_money(value)
