"""The first tables: plans, tenants, API keys, model deployments, prices and the ledger.

Later domains add their tables in their own modules against the same
`Base`; migrations are the only way a schema changes (tests check drift).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    String,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, PRICE, SECONDS, Base, UTCDateTime, new_id, utcnow

# The plan every tenant gets unless told otherwise; the 0002 migration inserts it.
DEFAULT_PLAN_ID = "pln_default"
DEFAULT_PLAN_NAME = "default"
WEIGHT = Numeric(10, 4, asdecimal=True)


class Plan(Base):
    """What a tenant may do: length tiers, rate limits, budgets, fair share, models.

    Tier defaults are the field's (< 512 tokens free-flowing, 512-2048 at most
    10 requests/s per key, longer queued and dropped after 30 s, prompts over
    8192 tokens refused). Every limit and budget column is nullable: NULL means
    unlimited, so a plan states only what it restricts.
    """

    __tablename__ = "plans"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("pln"))
    name: Mapped[str] = mapped_column(String(100), unique=True)
    free_below_tokens: Mapped[int] = mapped_column(Integer, default=512)
    limited_up_to_tokens: Mapped[int] = mapped_column(Integer, default=2048)
    limited_requests_per_s: Mapped[int] = mapped_column(Integer, default=10)
    long_queue_timeout_s: Mapped[int] = mapped_column(Integer, default=30)
    max_prompt_tokens: Mapped[int] = mapped_column(Integer, default=8192)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer)
    tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)
    max_concurrent_requests: Mapped[int | None] = mapped_column(Integer)
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger)
    spend_per_day: Mapped[Decimal | None] = mapped_column(MONEY)
    spend_per_month: Mapped[Decimal | None] = mapped_column(MONEY)
    fair_share_weight: Mapped[Decimal] = mapped_column(WEIGHT, default=Decimal(1))
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON)
    # The Batch API's queue limit (OpenAI's "enqueued tokens"): prompt tokens of a tenant's
    # unfinished batches of one model, apart from every interactive limit (migration 0007).
    batch_queue_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # Prepaid (migration 0008): requests are admitted only against the tenant's credits.
    prepaid: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    __table_args__ = (
        CheckConstraint(
            "free_below_tokens > 0 AND limited_up_to_tokens >= free_below_tokens"
            " AND limited_requests_per_s > 0 AND long_queue_timeout_s > 0"
            " AND max_prompt_tokens > 0",
            name="tiers",
        ),
        CheckConstraint(
            "(requests_per_minute IS NULL OR requests_per_minute >= 0)"
            " AND (tokens_per_minute IS NULL OR tokens_per_minute >= 0)"
            " AND (max_concurrent_requests IS NULL OR max_concurrent_requests >= 0)",
            name="limits",
        ),
        CheckConstraint(
            "(tokens_per_day IS NULL OR tokens_per_day >= 0)"
            " AND (tokens_per_month IS NULL OR tokens_per_month >= 0)"
            " AND (spend_per_day IS NULL OR spend_per_day >= 0)"
            " AND (spend_per_month IS NULL OR spend_per_month >= 0)",
            name="budgets",
        ),
        CheckConstraint("fair_share_weight > 0", name="weight"),
    )


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("ten"))
    name: Mapped[str] = mapped_column(String(200), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="active")
    contact_email: Mapped[str | None] = mapped_column(String(320))
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    # Nullable only because SQLite cannot add a NOT NULL foreign key column without
    # rebuilding `tenants`, and that rebuild would cascade-delete every API key. The
    # migration fills it and the service always sets it; NULL reads as the default plan.
    # No ON DELETE clause (NO ACTION: a plan in use cannot be deleted) because SQLite
    # does not reflect the options of the column-level REFERENCES the migration adds.
    plan_id: Mapped[str | None] = mapped_column(
        ForeignKey("plans.id"), index=True, default=DEFAULT_PLAN_ID
    )
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
    # Set on the old key when it is rotated: it keeps working until then, then stops.
    grace_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    rotated_from_id: Mapped[str | None] = mapped_column(
        ForeignKey("api_keys.id", ondelete="SET NULL")
    )
    # The project it belongs to (migration 0016); NULL: a tenant-level key. No ON DELETE
    # clause: projects are archived, never deleted, and SQLite does not reflect the
    # options of the column-level REFERENCES the migration adds (as `tenants.plan_id`).
    project_id: Mapped[str | None] = mapped_column(ForeignKey("projects.id"), index=True)
    # The key's own budgets (migration 0016), NULL = none; checked beside its project's and
    # its tenant's. No CHECK (>= 0): on SQLite one would rebuild `api_keys`; the API
    # refuses negative values.
    tokens_per_day: Mapped[int | None] = mapped_column(BigInteger)
    tokens_per_month: Mapped[int | None] = mapped_column(BigInteger)
    spend_per_day: Mapped[Decimal | None] = mapped_column(MONEY)
    spend_per_month: Mapped[Decimal | None] = mapped_column(MONEY)


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
    """A price version: per million tokens, effective from a moment, never edited after use.

    The `batch_*` prices are what a Batch API line is charged (migration 0007); NULL is
    the default, half the interactive price (`billing.pricing.batch_price`), since batch
    lines run in capacity interactive traffic leaves idle. Nullable, not backfilled: on
    SQLite a NOT NULL column would rebuild `prices`, which the ledger references. The
    service refuses negative prices (a CHECK would need that rebuild too).
    """

    __tablename__ = "prices"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("prc"))
    model_id: Mapped[str] = mapped_column(ForeignKey("models.id", ondelete="RESTRICT"))
    effective_from: Mapped[datetime] = mapped_column(UTCDateTime())
    currency: Mapped[str] = mapped_column(String(3), default="USD")
    input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    cached_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    output_per_mtok: Mapped[Decimal] = mapped_column(PRICE)
    batch_input_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    batch_cached_input_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    batch_output_per_mtok: Mapped[Decimal | None] = mapped_column(PRICE)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("model_id", "effective_from"),
        CheckConstraint(
            "input_per_mtok >= 0 AND cached_input_per_mtok >= 0 AND output_per_mtok >= 0",
            name="non_negative",
        ),
    )


class LedgerEntry(Base):
    """Exactly one row per request, keyed by its id: inserts are insert-if-absent.

    `batch_id` names the batch a Batch API line belongs to (charged at the batch price);
    NULL for interactive requests. No foreign key: the ledger outlives any batch row.
    """

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
    batch_id: Mapped[str | None] = mapped_column(String(64))
    # The LoRA adapter the request ran with (migration 0010); NULL: the base model alone.
    # `model_id` stays the base model (its device ran the request), `price_id` is the
    # adapter's own price version when it has one.
    adapter: Mapped[str | None] = mapped_column(String(64))
    # Attribution below the tenant (migration 0016). `project_id` is the key's project when
    # the request ran (no foreign key, as `batch_id`: the entry keeps what was true then).
    # `end_user` is the HMAC of the request's `user`/`safety_identifier` under the server
    # secret (ledger/attribution.py), never the raw id; `tags` the request's checked tags,
    # a flat string-to-string object that reports group by one key of.
    project_id: Mapped[str | None] = mapped_column(String(40))
    end_user: Mapped[str | None] = mapped_column(String(64))
    tags: Mapped[dict[str, str] | None] = mapped_column(JSON)

    __table_args__ = (
        CheckConstraint("status IN ('finished', 'stopped', 'aborted', 'failed')", name="status"),
        CheckConstraint(
            "input_tokens >= 0 AND cached_tokens >= 0 AND output_tokens >= 0",
            name="non_negative_tokens",
        ),
        Index(None, "tenant_id", "finished_at"),
        Index(None, "model_id", "finished_at"),
        Index(None, "batch_id"),
        Index(None, "project_id", "finished_at"),
    )


# --- Jobs and digests (issue #7, migration 0003) ------------------------------------------


class DigestSettings(Base):
    """When a tenant's daily digest goes out: the hour of its own day, in its time zone."""

    __tablename__ = "digest_settings"

    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    send_hour: Mapped[int] = mapped_column(Integer, default=8)
    timezone: Mapped[str] = mapped_column(String(64), default="UTC")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    __table_args__ = (CheckConstraint("send_hour >= 0 AND send_hour <= 23", name="send_hour"),)


class DigestRecipient(Base):
    __tablename__ = "digest_recipients"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dgr"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    email: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (UniqueConstraint("tenant_id", "email"),)


class DigestUnsubscribe(Base):
    """A recipient who said stop. `scope` is the tenant id, or `admin` for the admin digest.

    Kept apart from the recipient list so an admin re-saving the list never
    re-subscribes someone who unsubscribed.
    """

    __tablename__ = "digest_unsubscribes"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dgu"))
    scope: Mapped[str] = mapped_column(String(40))
    email: Mapped[str] = mapped_column(String(320))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (UniqueConstraint("scope", "email"),)


class DigestSend(Base):
    """The claim on one digest: inserted (unique) before the mail goes out, so it goes once.

    A row left at `sending` (the worker died mid-send) is never re-sent on its own:
    the mail may have left, and a duplicate is worse than a missing digest.
    """

    __tablename__ = "digest_sends"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("dgs"))
    kind: Mapped[str] = mapped_column(String(16))
    subject_id: Mapped[str] = mapped_column(String(40))
    day: Mapped[date] = mapped_column(Date)
    status: Mapped[str] = mapped_column(String(16), default="sending")
    recipients: Mapped[int] = mapped_column(Integer, default=0)
    message_id: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("kind", "subject_id", "day"),
        CheckConstraint("kind IN ('tenant', 'admin')", name="kind"),
        CheckConstraint("status IN ('sending', 'sent', 'skipped')", name="status"),
    )


class BudgetAlertSend(Base):
    """One alert per (tenant, owner, budget, period, threshold): claimed before it is mailed.

    The owner is the id of the tenant (its plan's budgets), project or API key whose
    budget it is (migration 0018); ids are unique across tables, so the owner alone
    tells the budgets apart and `scope` says which kind it names.
    """

    __tablename__ = "budget_alert_sends"

    id: Mapped[str] = mapped_column(String(40), primary_key=True, default=lambda: new_id("bal"))
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    scope: Mapped[str] = mapped_column(String(16), default="tenant", server_default="tenant")
    # No foreign key: it names one of three tables (projects and keys are never deleted).
    owner: Mapped[str] = mapped_column(String(40))
    budget: Mapped[str] = mapped_column(String(32))
    period: Mapped[str] = mapped_column(String(16))
    threshold: Mapped[int] = mapped_column(Integer)
    used: Mapped[Decimal] = mapped_column(MONEY)
    limit: Mapped[Decimal] = mapped_column(MONEY)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    claimed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("tenant_id", "owner", "budget", "period", "threshold"),
        CheckConstraint("status IN ('pending', 'sending', 'sent')", name="status"),
        CheckConstraint("scope IN ('tenant', 'project', 'key')", name="scope"),
    )


class LedgerHourlyRollup(Base):
    """Ledger sums per UTC hour, tenant and model, rewritten by the hourly rollup job; the
    `batch_*` columns are the Batch API's part of the totals (its lines' entries)."""

    __tablename__ = "ledger_hourly_rollups"

    hour: Mapped[datetime] = mapped_column(UTCDateTime(), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    charged: Mapped[Decimal] = mapped_column(MONEY)
    device_seconds: Mapped[Decimal] = mapped_column(SECONDS)
    device_cost: Mapped[Decimal] = mapped_column(MONEY)
    batch_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    batch_charged: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0), server_default="0")
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


# --- Stored responses (the Responses API's `store`, migration 0004) -----------------------


class StoredResponse(Base):
    """A Responses API answer kept for `previous_response_id`, retrieval and deletion, as
    OpenAI keeps them (`store`, on by default), until it expires. It holds the tenant's
    conversation: the input items it answered (earlier turns included) and the answer."""

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    # The conversation, AES-GCM sealed (`inference/responses/seal.py`). The two plain
    # columns hold rows stored before sealing (migration 0005) until they expire.
    sealed: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    input_items: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    body: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (Index(None, "tenant_id", "created_at"), Index(None, "expires_at"))


# Imported here so that every table is on the metadata whenever the models are.
# --- Projects (issue #26): attribution below the tenant (db/project_models.py) -----------
# --- LoRA adapters (issue #28): registered per base model (db/adapter_models.py) ----------
from hydrant.platform.db.adapter_models import Adapter as Adapter  # noqa: E402

# --- The Batch API (issue #27): files, batches, their lines (db/batch_models.py) ----------
from hydrant.platform.db.batch_models import Batch as Batch  # noqa: E402
from hydrant.platform.db.batch_models import BatchLine as BatchLine  # noqa: E402
from hydrant.platform.db.batch_models import FileBlob as FileBlob  # noqa: E402
from hydrant.platform.db.batch_models import StoredFile as StoredFile  # noqa: E402

# --- Prepaid credits (issue #26): grants, applications, low-balance alerts (credit_models) -
from hydrant.platform.db.credit_models import CreditAlertSend as CreditAlertSend  # noqa: E402
from hydrant.platform.db.credit_models import CreditAlertThreshold as CreditAlertThreshold  # noqa: E402
from hydrant.platform.db.credit_models import CreditApplication as CreditApplication  # noqa: E402
from hydrant.platform.db.credit_models import CreditGrant as CreditGrant  # noqa: E402
from hydrant.platform.db.credit_models import CreditSettlement as CreditSettlement  # noqa: E402

# --- Usage export (issue #26): the outbox and Stripe customers (export_models) ------------
from hydrant.platform.db.export_models import BillingCustomer as BillingCustomer  # noqa: E402
from hydrant.platform.db.export_models import UsageExportRecord as UsageExportRecord  # noqa: E402

# --- Monthly invoices (issue #26): invoices, lines, billed entries, counters (invoice_models)
from hydrant.platform.db.invoice_models import Invoice as Invoice  # noqa: E402
from hydrant.platform.db.invoice_models import InvoiceCounter as InvoiceCounter  # noqa: E402
from hydrant.platform.db.invoice_models import InvoiceItem as InvoiceItem  # noqa: E402
from hydrant.platform.db.invoice_models import InvoiceLine as InvoiceLine  # noqa: E402
from hydrant.platform.db.invoice_models import InvoiceSend as InvoiceSend  # noqa: E402
from hydrant.platform.db.project_models import Project as Project  # noqa: E402

# --- Cost reconciliation (issue #26): worker timelines, daily rows (reconciliation_models)
from hydrant.platform.db.reconciliation_models import (  # noqa: E402
    PoolReconciliation as PoolReconciliation,
)
from hydrant.platform.db.reconciliation_models import (  # noqa: E402
    ReconciliationLine as ReconciliationLine,
)
from hydrant.platform.db.reconciliation_models import (  # noqa: E402
    WorkerStateInterval as WorkerStateInterval,
)
