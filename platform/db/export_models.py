"""The usage export's tables (issue #26): its outbox of hourly usage records and the
per-tenant Stripe customer it is billed as.

A record is written once and never edited but for its delivery state: usage that reaches
the ledger after its hour was exported becomes a further record (the next `sequence`,
its own idempotency key) holding only the difference, so a receiver that has counted a
key never sees it change.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, Base, UTCDateTime, new_id, utcnow

EXPORT_STATUSES = ("pending", "sending", "sent")


class UsageExportRecord(Base):
    """One (tenant, model, UTC hour, sequence) of ledger usage, waiting for or past delivery.

    `pending` -> `sending` (claimed by one exporter under `claim`, until `claimed_at` plus
    the lease) -> `sent` only after the receiver's 2xx. A `sending` row whose lease lapsed
    (its exporter died) is claimed again and re-sent: at least once, never skipped.
    """

    __tablename__ = "usage_export_records"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("uxr"))
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    model: Mapped[str] = mapped_column(String(200))
    hour: Mapped[datetime] = mapped_column(UTCDateTime())
    sequence: Mapped[int] = mapped_column(Integer)
    requests: Mapped[int] = mapped_column(BigInteger)
    input_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    charged: Mapped[Decimal] = mapped_column(MONEY)
    status: Mapped[str] = mapped_column(String(10), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    claim: Mapped[str | None] = mapped_column(String(40))
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("tenant_id", "model", "hour", "sequence"),
        CheckConstraint("status IN ('pending', 'sending', 'sent')", name="status"),
        CheckConstraint("sequence >= 0", name="sequence"),
        Index(None, "status", "next_attempt_at"),
        Index(None, "hour"),
    )


class BillingCustomer(Base):
    """The Stripe customer a tenant's usage is reported for (`payload.stripe_customer_id`).

    A table of its own rather than a `tenants` column: billing identities are not the
    tenant's, and a tenant without one simply has its records wait until it is set.
    """

    __tablename__ = "billing_customers"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    stripe_customer_id: Mapped[str] = mapped_column(String(100))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
