"""Billing arithmetic: money and its one rounding rule, token prices, device cost, exact splits."""

from hydrant.platform.billing.allocation import split_exact
from hydrant.platform.billing.device import DevicePrice, device_cost, seconds_from_ns
from hydrant.platform.billing.money import (
    MICROS_PER_UNIT,
    REPORT_PLACES,
    STORAGE_PLACES,
    from_micro_units,
    require_money,
    round_money,
    to_micro_units,
)
from hydrant.platform.billing.pricing import (
    BATCH_DISCOUNT,
    Price,
    TokenUsage,
    batch_price,
    charge_for,
)

__all__ = [
    "BATCH_DISCOUNT",
    "MICROS_PER_UNIT",
    "REPORT_PLACES",
    "STORAGE_PLACES",
    "DevicePrice",
    "Price",
    "TokenUsage",
    "batch_price",
    "charge_for",
    "device_cost",
    "from_micro_units",
    "require_money",
    "round_money",
    "seconds_from_ns",
    "split_exact",
    "to_micro_units",
]
