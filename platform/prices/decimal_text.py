"""Exact decimals in JSON: money travels as strings ("0.150000"), never as floats.

Why refuse JSON floats even though a decoder could read them exactly: a client
that sends `0.15` built it as a binary float somewhere, and the next value it
sends may be `0.30000000000000004`. A string is what the client meant. Integers
are exact, so they are accepted.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Annotated

import msgspec

from hydrant.platform.errors import InvalidRequest

DISPLAY_PLACES = 6

# A JSON string of digits with an optional fraction, or a JSON integer; a JSON float
# fails decoding ("Expected `str | int`, got `float`"), which answers 400.
DECIMAL_PATTERN = r"^[0-9]{1,20}(\.[0-9]{1,20})?$"
DecimalText = (
    Annotated[
        str,
        msgspec.Meta(
            pattern=DECIMAL_PATTERN,
            description='a non-negative decimal as a string, e.g. "0.150000"',
        ),
    ]
    | int
)


def parse_decimal(
    value: str | int,
    *,
    param: str,
    places: int,
    integer_digits: int,
    positive: bool = False,
) -> Decimal:
    """The exact value, or a 400 naming `param` when it does not fit the column."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidRequest(f'{param} must be a decimal string such as "0.15"', param=param)
    try:
        amount = Decimal(value)
    except InvalidOperation:
        raise InvalidRequest(f"{param} is not a decimal number", param=param) from None
    if not amount.is_finite() or amount < 0 or (positive and amount == 0):
        kind = "positive" if positive else "zero or positive"
        raise InvalidRequest(f"{param} must be {kind}", param=param)
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > places:
        raise InvalidRequest(f"{param} has more than {places} decimal places", param=param)
    if amount.adjusted() + 1 > integer_digits:
        raise InvalidRequest(f"{param} is too large", param=param)
    return amount


def format_decimal(value: Decimal, min_places: int = DISPLAY_PLACES) -> str:
    """At least `min_places` decimals, more only when the value needs them."""
    shown = value.quantize(Decimal(1).scaleb(-min_places))
    if shown == value:
        return f"{shown:f}"
    return f"{value.normalize():f}"
