"""What a request costs in device time: device-seconds at a configured price per device-hour.

Why device time is measured in integer nanoseconds at the source: the engine
reads `time.perf_counter_ns()`, and an int converts to Decimal exactly, so no
float ever enters the money path (`seconds_from_ns`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from hydrant.platform.billing.money import MONEY_CONTEXT, require_money, round_money

SECONDS_PER_HOUR = 3600
NANOS_PER_SECOND = 10**9


@dataclass(frozen=True)
class DevicePrice:
    """The price of one device (one GPU, or one CPU worker) for one hour."""

    per_hour: Decimal

    def __post_init__(self) -> None:
        if require_money(self.per_hour, "per_hour") < 0:
            raise ValueError("per_hour must not be negative")


def seconds_from_ns(nanoseconds: int) -> Decimal:
    """Exact device-seconds from an integer nanosecond count."""
    if isinstance(nanoseconds, bool) or not isinstance(nanoseconds, int):
        raise TypeError("nanoseconds must be an int")
    if nanoseconds < 0:
        raise ValueError("nanoseconds must not be negative")
    return Decimal(nanoseconds).scaleb(-9, context=MONEY_CONTEXT)


def device_cost(device_seconds: Decimal, price: DevicePrice) -> Decimal:
    """seconds × price per hour / 3600, rounded once with `round_money`.

    The division by 3600 is carried to 60 significant digits before rounding,
    far below the half-micro-unit that rounding then removes.
    """
    seconds = require_money(device_seconds, "device_seconds")
    if seconds < 0:
        raise ValueError("device_seconds must not be negative")
    ctx = MONEY_CONTEXT
    raw = ctx.divide(ctx.multiply(seconds, price.per_hour), Decimal(SECONDS_PER_HOUR))
    return round_money(raw)
