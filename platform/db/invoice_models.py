"""Monthly invoices (issue #26): finalized invoices, their frozen lines, which ledger entries
each one billed, the gap-free number counters, and the mail of each invoice.

A draft is never stored: it is computed from the ledger on read. Only finalization
writes, once per tenant and month, and nothing ever updates an invoice or its lines
afterwards. `InvoiceItem` (one row per ledger entry, keyed by its request id, as
`credit_settlements`) is what makes an entry billed exactly once: an entry with no item
is not billed yet, whatever month it belongs to, so a late one lands on the next invoice.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, PRICE, Base, UTCDateTime, new_id, utcnow


class Invoice(Base):
    """A finalized invoice: numbered (`HYD-2026-000123`), immutable. `period` is the
    tenant's local month (`2026-11`), `[period_start, period_end)` its UTC bounds in the
    tenant's `timezone` as it was at finalization. `subtotal` and `credits_applied` are
    exact sums of ledger charges and credit applications; `amount_due` is their
    difference rounded once to cents (billing/money.py)."""

    __tablename__ = "invoices"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("inv"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    period: Mapped[str] = mapped_column(String(7))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    period_end: Mapped[datetime] = mapped_column(UTCDateTime())
    timezone: Mapped[str] = mapped_column(String(64))
    currency: Mapped[str] = mapped_column(String(3))
    issuer: Mapped[str] = mapped_column(String(16))
    number: Mapped[str] = mapped_column(String(40), unique=True)
    subtotal: Mapped[Decimal] = mapped_column(MONEY)
    credits_applied: Mapped[Decimal] = mapped_column(MONEY)
    amount_due: Mapped[Decimal] = mapped_column(MONEY)
    finalized_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant_id", "period"),
        CheckConstraint("credits_applied >= 0 AND amount_due >= 0", name="amounts"),
        Index(None, "tenant_id", "period_end"),
    )


class InvoiceLine(Base):
    """One frozen line: usage of one model at one price version (interactive or batch
    price) in the period, or (`kind` = adjustment) such usage of an earlier, already
    invoiced month (`usage_period`) that reached the ledger after that invoice."""

    __tablename__ = "invoice_lines"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    invoice_id: Mapped[str] = mapped_column(ForeignKey("invoices.id", ondelete="RESTRICT"))
    position: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(10))
    usage_period: Mapped[str] = mapped_column(String(7))
    model: Mapped[str] = mapped_column(String(200))
    price_id: Mapped[str | None] = mapped_column(String(40))
    price_effective_from: Mapped[datetime | None] = mapped_column(UTCDateTime())
    batch: Mapped[bool] = mapped_column(Boolean, default=False)
    requests: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer)  # uncached input
    cached_input_tokens: Mapped[int] = mapped_column(Integer)
    output_tokens: Mapped[int] = mapped_column(Integer)
    input_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    cached_input_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    output_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    credits_applied: Mapped[Decimal] = mapped_column(MONEY)

    __table_args__ = (
        CheckConstraint("kind IN ('usage', 'adjustment')", name="kind"),
        UniqueConstraint("invoice_id", "position"),
    )


class InvoiceItem(Base):
    """A ledger entry billed by a finalized invoice: the primary key bills it once."""

    __tablename__ = "invoice_items"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    invoice_id: Mapped[str] = mapped_column(ForeignKey("invoices.id", ondelete="RESTRICT"))

    __table_args__ = (Index(None, "invoice_id"),)


class InvoiceCounter(Base):
    """The last number an issuer gave in a year. Taken by an UPDATE in the transaction that
    writes the invoice, so its row lock orders concurrent finalizers and a rolled-back
    finalization gives its number back: the sequence has no gaps."""

    __tablename__ = "invoice_counters"

    issuer: Mapped[str] = mapped_column(String(16), primary_key=True)
    year: Mapped[int] = mapped_column(Integer, primary_key=True)
    last_number: Mapped[int] = mapped_column(Integer, default=0)


class InvoiceSend(Base):
    """The mail of one invoice to the tenant's billing contacts: unique per invoice (the
    idempotency key), `pending` -> `sending` -> `sent` as the alerts (digests/alert_mail.py)."""

    __tablename__ = "invoice_sends"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ins"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    invoice_id: Mapped[str] = mapped_column(
        ForeignKey("invoices.id", ondelete="RESTRICT"), unique=True
    )
    status: Mapped[str] = mapped_column(String(10), default="pending")
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (Index(None, "status", "claimed_at"),)
