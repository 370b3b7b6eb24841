"""Prepaid credits (issue #26): grants, the ledger entries they paid, and which paid what.

Kept beside `models.py` (which imports this module, so every table is on the one
metadata). A balance is never stored: it is the grants minus their applications, and
the applications are derived from the ledger (each ledger entry of a prepaid tenant is
applied once, keyed by its request id), so nothing here can drift from the ledger.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, String, UniqueConstraint
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
