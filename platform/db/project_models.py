"""Projects (issue #26, migration 0016): the level of attribution below the tenant.

A key belongs to at most one project (`api_keys.project_id`); NULL is a tenant-level
key, which is what every key made before projects existed stays (no default project is
invented: a report would have to explain a project nobody made). A project's budgets
and rates are limits beside the plan's tenant ones: the strictest that applies refuses
first.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import BigInteger, CheckConstraint, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, Base, UTCDateTime, new_id, utcnow

PROJECT_STATUSES = ("active", "archived")


class Project(Base):
    """A named group of a tenant's keys; archived, never deleted (the ledger names it)."""

    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("proj"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="active")
    # Rates per minute and budgets per period, NULL = none (the plan's still apply).
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger)
    spend_per_day: Mapped[Decimal | None] = mapped_column(MONEY)
    spend_per_month: Mapped[Decimal | None] = mapped_column(MONEY)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    archived_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("tenant_id", "name"),
        CheckConstraint("status IN ('active', 'archived')", name="status"),
        CheckConstraint(
            "(requests_per_minute IS NULL OR requests_per_minute >= 0)"
            " AND (tokens_per_minute IS NULL OR tokens_per_minute >= 0)",
            name="limits",
        ),
        CheckConstraint(
            "(tokens_per_day IS NULL OR tokens_per_day >= 0)"
            " AND (tokens_per_month IS NULL OR tokens_per_month >= 0)"
            " AND (spend_per_day IS NULL OR spend_per_day >= 0)"
            " AND (spend_per_month IS NULL OR spend_per_month >= 0)",
            name="budgets",
        ),
    )
