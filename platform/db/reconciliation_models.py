"""Cost reconciliation's tables (issue #26): worker state intervals and the daily rows.

`worker_state_intervals` is the device timeline: one row per (worker, state, the
moment the worker entered that state), stretched to the last heartbeat seen in it and
closed at the next state's start (platform/reconciliation/recorder.py states the rule).
The daily rows are what the reconciliation job computed for a (UTC day, pool), and each
tenant's share of it; the job replaces a day's rows whole, so running it twice is harmless.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import CheckConstraint, Date, Index, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, SECONDS, Base, UTCDateTime, utcnow

INTERVAL_STATES = ("starting", "ready", "sleeping", "draining", "unloaded")


class WorkerStateInterval(Base):
    """A worker held its device in `state` from `started_at` to `ended_at`."""

    __tablename__ = "worker_state_intervals"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    worker_id: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(200))
    device: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("worker_id", "state", "started_at"),
        CheckConstraint("ended_at >= started_at", name="ordered"),
        CheckConstraint(
            "state IN ('starting', 'ready', 'sleeping', 'draining', 'unloaded')", name="state"
        ),
        Index(None, "ended_at", "started_at"),
    )


class PoolReconciliation(Base):
    """One pool's (model's) day: device-seconds held per state and the costs that balance."""

    __tablename__ = "pool_reconciliations"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    price_per_hour: Mapped[Decimal] = mapped_column(MONEY)
    held_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    load_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    ready_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    drain_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    asleep_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    busy_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    held_cost: Mapped[Decimal] = mapped_column(MONEY)
    request_cost: Mapped[Decimal] = mapped_column(MONEY)
    idle_cost: Mapped[Decimal] = mapped_column(MONEY)
    load_cost: Mapped[Decimal] = mapped_column(MONEY)
    drain_cost: Mapped[Decimal] = mapped_column(MONEY)
    asleep_cost: Mapped[Decimal] = mapped_column(MONEY)
    computed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ReconciliationLine(Base):
    """A tenant's part of a pool's day: revenue, its device cost, its share of idle cost."""

    __tablename__ = "reconciliation_lines"

    day: Mapped[date] = mapped_column(Date, primary_key=True)
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    # No foreign key: like the ledger's rollups, the rows outlive nothing they name.
    tenant_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    busy_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    revenue: Mapped[Decimal] = mapped_column(MONEY)
    device_cost: Mapped[Decimal] = mapped_column(MONEY)
    idle_cost: Mapped[Decimal] = mapped_column(MONEY)
