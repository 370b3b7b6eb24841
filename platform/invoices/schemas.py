"""Bodies of the invoices API (`/account/invoices`, `/admin/tenants/{id}/invoices`). Money is
a decimal string, never a JSON float: line amounts and the subtotal exact (6 places, as
the ledger stores charges), the amount due rounded to cents."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Literal

from msgspec import Struct

from hydrant.platform.invoices.service import FinalizeReport
from hydrant.platform.invoices.statement import InvoiceDoc, Line
from hydrant.platform.prices.decimal_text import format_decimal


def _rate(value: Decimal | None) -> str | None:
    return None if value is None else format_decimal(value)


class LineView(Struct, kw_only=True):
    kind: Literal["usage", "adjustment"]
    usage_period: str  # an adjustment's month; "" on a usage line (the invoice's month)
    description: str
    model: str
    price_id: str | None
    price_effective_from: datetime | None
    price_kind: Literal["interactive", "batch"]
    requests: int
    input_tokens: int  # uncached
    cached_input_tokens: int
    output_tokens: int
    input_per_mtok: str | None
    cached_input_per_mtok: str | None
    output_per_mtok: str | None
    amount: str
    credits_applied: str

    @classmethod
    def of(cls, line: Line) -> LineView:
        return cls(
            kind=line.kind,
            usage_period=line.usage_period,
            description=line.description,
            model=line.model,
            price_id=line.price_id,
            price_effective_from=line.price_effective_from,
            price_kind="batch" if line.batch else "interactive",
            requests=line.requests,
            input_tokens=line.input_tokens,
            cached_input_tokens=line.cached_input_tokens,
            output_tokens=line.output_tokens,
            input_per_mtok=_rate(line.input_per_mtok),
            cached_input_per_mtok=_rate(line.cached_input_per_mtok),
            output_per_mtok=_rate(line.output_per_mtok),
            amount=format_decimal(line.amount),
            credits_applied=format_decimal(line.credits_applied),
        )


class InvoiceView(Struct, kw_only=True):
    id: str  # `inv_…` once finalized; a draft's is its month, which reads it too
    object: Literal["invoice"] = "invoice"
    status: Literal["draft", "finalized"]
    number: str | None
    tenant_id: str
    period: str
    period_start: datetime
    period_end: datetime
    timezone: str
    currency: str
    lines: list[LineView]
    subtotal: str
    credits_applied: str
    amount_due: str
    finalized_at: datetime | None

    @classmethod
    def of(cls, doc: InvoiceDoc) -> InvoiceView:
        return cls(
            id=doc.id,
            status=doc.status,
            number=doc.number,
            tenant_id=doc.tenant_id,
            period=doc.period,
            period_start=doc.period_start,
            period_end=doc.period_end,
            timezone=doc.timezone,
            currency=doc.currency,
            lines=[LineView.of(line) for line in doc.lines],
            subtotal=format_decimal(doc.totals.subtotal),
            credits_applied=format_decimal(doc.totals.credits_applied),
            amount_due=f"{doc.totals.amount_due:f}",
            finalized_at=doc.finalized_at,
        )


class InvoiceList(Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[InvoiceView]


class FinalizeView(Struct, kw_only=True):
    object: Literal["invoice.finalization"] = "invoice.finalization"
    month: str | None  # None: each tenant's previous month in its own zone
    created: list[str]
    existing: list[str]
    empty: int  # tenants with nothing to bill: no invoice
    still_open: int  # tenants in whose zone the month has not ended yet
    failed: list[str]

    @classmethod
    def of(cls, month: str | None, report: FinalizeReport) -> FinalizeView:
        return cls(
            month=month,
            created=report.created,
            existing=report.existing,
            empty=report.empty,
            still_open=report.still_open,
            failed=report.failed,
        )
