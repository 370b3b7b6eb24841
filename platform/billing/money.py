"""Money values and the one rounding rule.

The rule, used everywhere: charges are rounded ONCE, when a ledger entry is
written, to 6 decimal places of the currency unit (micro-units) with
ROUND_HALF_EVEN; totals are exact sums of stored charges and are never
re-rounded at 6 places; reports round the total (never the lines) to 2 places
with the same function. Why half-even: it has no bias, so over many entries
the per-entry rounding errors cancel on average instead of piling up in one
direction. Why 6 places: a per-million-token price of $0.01 on a single token
is $0.00000001, so cents would lose nearly every small request; micro-units
keep each request's error below half a micro-unit, and they fit Redis
integers (see `to_micro_units`) and `NUMERIC(20, 6)`.

Floats are refused with TypeError: a float has already lost the cents.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Context, Decimal, DivisionByZero, InvalidOperation, Overflow

STORAGE_PLACES = 6
REPORT_PLACES = 2
MICROS_PER_UNIT = 10**STORAGE_PLACES

# Enough digits for any realistic amount times any token count, so no product is rounded
# before `round_money`; invalid operations raise instead of producing NaN.
MONEY_CONTEXT = Context(
    prec=60, rounding=ROUND_HALF_EVEN, traps=[InvalidOperation, DivisionByZero, Overflow]
)


def require_money(value: object, name: str = "amount") -> Decimal:
    """Accept a finite Decimal (or an int); refuse floats and everything else with TypeError."""
    if isinstance(value, bool) or not isinstance(value, Decimal | int):
        raise TypeError(f"{name} must be a Decimal (or int), not {type(value).__name__}")
    amount = Decimal(value)
    if not amount.is_finite():
        raise ValueError(f"{name} must be a finite number")
    return amount


def round_money(value: Decimal, places: int = STORAGE_PLACES) -> Decimal:
    """THE rounding function: half-even to `places` decimals (6 to store, 2 to report)."""
    amount = require_money(value)
    if not 0 <= places <= STORAGE_PLACES:
        raise ValueError(f"places must be between 0 and {STORAGE_PLACES}")
    return amount.quantize(Decimal(1).scaleb(-places), context=MONEY_CONTEXT)


def to_micro_units(value: Decimal) -> int:
    """Round to storage precision and express as an integer count of micro-units."""
    return int(round_money(value).scaleb(STORAGE_PLACES, context=MONEY_CONTEXT))


def from_micro_units(micros: int) -> Decimal:
    """The exact Decimal for an integer count of micro-units."""
    if isinstance(micros, bool) or not isinstance(micros, int):
        raise TypeError("micro-units are an int")
    return Decimal(micros).scaleb(-STORAGE_PLACES, context=MONEY_CONTEXT)
