"""The first tables: tenants, API keys, model deployments, prices and the ledger.

Later domains add their tables in their own modules against the same
`Base`; migrations are the only way a schema changes (tests check drift).
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, PRICE, SECONDS, Base, UTCDateTime, new_id, utcnow


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ten"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active")
    contact_email: Mapped[str | None] = mapped_column(String(320))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    __table_args__ = (CheckConstraint("status IN ('active', 'suspended')", name="status"),)


class ApiKey(Base):
    """A key is stored only as its HMAC; `prefix` is the public part used for lookup."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("key"))
    tenant_id: Mapped[str | None] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), index=True
    )
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(32), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(200), default="inference")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    rotated_from_id: Mapped[str | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL")
    )


class ModelDeployment(Base):
    """A model the platform sells: its public name, where its weights are, how it is served."""

    __tablename__ = "models"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("mdl"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    path: Mapped[str] = mapped_column(String(1000))
    status: Mapped[str] = mapped_column(String(16), default="active")
    quantization: Mapped[str | None] = mapped_column(String(16))
    kv_cache_dtype: Mapped[str | None] = mapped_column(String(16))
    max_model_len: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (CheckConstraint("status IN ('active', 'retired')", name="status"),)


class Price(Base):
    """A price version: per million tokens, effective from a moment, never edited after use."""

    __tablename__ = "prices"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("prc"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="RESTRICT"))
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    currency: Mapped[str] = mapped_column(String(3), default="USD")
    input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    cached_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    output_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("model_id", "effective_from"),
        CheckConstraint(
            "input_per_mtok >= 0 AND cached_input_per_mtok >= 0 AND output_per_mtok >= 0",
            name="non_negative",
        ),
    )


class LedgerEntry(Base):
    """Exactly one row per request, keyed by its id: inserts are insert-if-absent."""

    __tablename__ = "ledger_entries"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="RESTRICT"))
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="RESTRICT"))
    price_id: Mapped[str | None] = mapped_column(ForeignKey("prices.id", ondelete="RESTRICT"))
    status: Mapped[str] = mapped_column(String(16))
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    charged: Mapped[Decimal] = mapped_column(MONEY)
    device_seconds: Mapped[Decimal] = mapped_column(SECONDS, default=Decimal(0))
    device_cost: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime())
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        CheckConstraint("status IN ('finished', 'stopped', 'aborted', 'failed')", name="status"),
        CheckConstraint(
            "input_tokens >= 0 AND cached_tokens >= 0 AND output_tokens >= 0",
            name="non_negative_tokens",
        ),
        Index(None, "tenant_id", "finished_at"),
        Index(None, "model_id", "finished_at"),
    )
