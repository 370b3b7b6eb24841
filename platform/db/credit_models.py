"""Prepaid credits (issue #26): grants, the ledger entries they paid, and which paid what.

Kept beside `models.py` (which imports this module, so every table is on the one
metadata). A balance is never stored: it is the grants minus their applications, and
the applications are derived from the ledger (each ledger entry of a prepaid tenant is
applied once, keyed by its request id), so nothing here can drift from the ledger.
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

from hydrant.platform.db.base import MONEY, Base, UTCDateTime, new_id, utcnow

CREDIT_KINDS = ("paid", "promo")


class CreditGrant(Base):
    """Money a tenant may spend: `paid` (bought) or `promo` (given), in `currency`, until
    `expires_at` (NULL: no expiry) unless voided. Promo grants and those expiring soonest
    are spent first."""

    __tablename__ = "credit_grants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("cg"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(8))
    amount: Mapped[Decimal] = mapped_column(MONEY)
    currency: Mapped[str] = mapped_column(String(3), default="USD")
    note: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    voided_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint("kind IN ('paid', 'promo')", name="kind"),
        CheckConstraint("amount > 0", name="amount"),
        Index(None, "tenant_id", "created_at"),
    )


class CreditSettlement(Base):
    """One ledger entry paid from credits, keyed by its request id: the row whose primary
    key makes paying an entry happen once, whichever process gets there first (a second
    payer's insert is refused and it re-reads). `amount` is the entry's `charged`."""

    __tablename__ = "credit_settlements"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    amount: Mapped[Decimal] = mapped_column(MONEY)
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        CheckConstraint("amount >= 0", name="amount"),
        Index(None, "tenant_id", "applied_at"),
    )


class CreditApplication(Base):
    """Part of one settled entry's charge paid by one grant; `grant_id` NULL is the part no
    grant could pay (a charge above what the admission reserved). The applications of a
    request sum to its ledger entry's `charged`, exactly."""

    __tablename__ = "credit_applications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    request_id: Mapped[str] = mapped_column(
        ForeignKey("credit_settlements.request_id", ondelete="CASCADE")
    )
    grant_id: Mapped[str | None] = mapped_column(ForeignKey("credit_grants.id", ondelete="CASCADE"))
    amount: Mapped[Decimal] = mapped_column(MONEY)
    applied_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        CheckConstraint("amount > 0", name="amount"),
        UniqueConstraint("request_id", "grant_id"),
        Index(None, "tenant_id"),
        Index(None, "grant_id"),
    )


class CreditAlertThreshold(Base):
    """A low-balance alert level of a tenant: an absolute amount in its credits' currency.

    `below` is the crossing state and `crossings` counts them: a check that sees the
    balance under `amount` while `below` is false flips it with a conditional UPDATE
    (only one concurrent checker can) and claims the mail for crossing number
    `crossings`; the balance back at or above `amount` (a new grant) re-arms it."""

    __tablename__ = "credit_alert_thresholds"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ca"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    amount: Mapped[Decimal] = mapped_column(MONEY)
    below: Mapped[bool] = mapped_column(Boolean, default=False)
    crossings: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        CheckConstraint("amount > 0", name="amount"),
        UniqueConstraint("tenant_id", "amount"),
    )


class CreditAlertSend(Base):
    """One low-balance mail: unique per (threshold, crossing), the database's idempotency
    key, so two checkers (or one job delivered twice) can never mail a crossing twice.
    `pending` -> `sending` -> `sent` as the budget alerts (digests/alerts.py)."""

    __tablename__ = "credit_alert_sends"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("cas"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    threshold_id: Mapped[str] = mapped_column(
        ForeignKey("credit_alert_thresholds.id", ondelete="CASCADE")
    )
    crossing: Mapped[int] = mapped_column(Integer)
    amount: Mapped[Decimal] = mapped_column(MONEY)
    balance: Mapped[Decimal] = mapped_column(MONEY)
    currency: Mapped[str] = mapped_column(String(3), default="USD")
    status: Mapped[str] = mapped_column(String(10), default="pending")
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("threshold_id", "crossing"),
        Index(None, "status", "claimed_at"),
    )
