"""An invoice as data, the same for a draft (computed on read) and a finalized invoice (read
back from its frozen rows): what the JSON, CSV, HTML, PDF and mail all render.

The totals are computed in one place (`totals`): the subtotal is the exact sum of the
lines (each line the exact sum of its ledger entries' charges, 6 places), credits
applied are what the tenant's grants paid of those same entries, never more than the
subtotal, and the amount due is their difference rounded once, to cents, with THE
rounding function (billing/money.py: reports round the total, never the lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Literal

from hydrant.platform.billing.money import REPORT_PLACES, round_money

Status = Literal["draft", "finalized"]
LineKind = Literal["usage", "adjustment"]


@dataclass(frozen=True)
class Line:
    """Usage of one model at one price version (interactive or batch price). An adjustment
    is such usage of an earlier month (`usage_period`) that reached the ledger after that
    month's invoice was finalized."""

    kind: LineKind
    usage_period: str
    model: str
    price_id: str | None
    price_effective_from: datetime | None
    batch: bool
    requests: int
    input_tokens: int  # uncached input tokens
    cached_input_tokens: int
    output_tokens: int
    input_per_mtok: Decimal | None
    cached_input_per_mtok: Decimal | None
    output_per_mtok: Decimal | None
    amount: Decimal
    credits_applied: Decimal

    @property
    def description(self) -> str:
        price = "batch price" if self.batch else "price"
        if self.price_effective_from is None:
            text = f"{self.model}, no price version"
        else:
            text = f"{self.model}, {price} from {self.price_effective_from:%Y-%m-%d}"
        if self.kind == "adjustment":
            return f"Adjustment for {self.usage_period}: {text}"
        return text


@dataclass(frozen=True)
class Totals:
    subtotal: Decimal
    credits_applied: Decimal
    amount_due: Decimal


def totals(lines: Sequence[Line]) -> Totals:
    subtotal = sum((line.amount for line in lines), Decimal(0))
    paid = min(subtotal, sum((line.credits_applied for line in lines), Decimal(0)))
    return Totals(subtotal, paid, round_money(subtotal - paid, REPORT_PLACES))


@dataclass(frozen=True)
class InvoiceDoc:
    id: str  # the invoice's id once finalized; a draft's is its month (`2026-12`)
    status: Status
    number: str | None
    tenant_id: str
    tenant_name: str
    period: str
    period_start: datetime
    period_end: datetime
    timezone: str
    currency: str
    lines: tuple[Line, ...]
    totals: Totals
    issuer_name: str
    finalized_at: datetime | None = None

    @property
    def usage_lines(self) -> tuple[Line, ...]:
        return tuple(line for line in self.lines if line.kind == "usage")

    @property
    def adjustments(self) -> tuple[Line, ...]:
        return tuple(line for line in self.lines if line.kind == "adjustment")

    @property
    def title(self) -> str:
        if self.number is not None:
            return f"Invoice {self.number}"
        return f"Draft invoice {self.period}"
