"""The Batch API's tables (issue #27): files (migration 0006), batches and their lines.

Kept beside `models.py` (which imports this module, so every table is on the one
metadata) because they are one feature's tables and `models.py` is long enough.
A file's content and a line's result are tenant data: they are stored sealed
(`platform/sealing.py`), never in a plain column.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
)
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import MONEY, PRICE, Base, UTCDateTime, utcnow

FILE_PURPOSES = ("batch", "batch_output")


class StoredFile(Base):
    """A file of OpenAI's Files API: an upload (`batch`) or a batch's output or errors
    (`batch_output`). Its content lives sealed in `file_blobs`, or on the files volume
    (`HYDRANT_FILES_DIR`), as `storage` says; it is deleted after `expires_at`."""

    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(Integer)
    lines: Mapped[int] = mapped_column(Integer, default=0)
    storage: Mapped[str] = mapped_column(String(16), default="database")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(f"purpose IN {FILE_PURPOSES}", name="purpose"),
        CheckConstraint("storage IN ('database', 'volume')", name="storage"),
        CheckConstraint("bytes >= 0 AND lines >= 0", name="sizes"),
        Index(None, "tenant_id", "created_at"),
        Index(None, "expires_at"),
    )


class FileBlob(Base):
    """A file's sealed content when it is kept in the database (its own table, so listing
    files never reads contents)."""

    __tablename__ = "file_blobs"

    file_id: Mapped[str] = mapped_column(
        ForeignKey("files.id", ondelete="CASCADE"), primary_key=True
    )
    sealed: Mapped[bytes] = mapped_column(LargeBinary)


BATCH_STATUSES = (
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
)


class Batch(Base):
    """A batch of OpenAI's Batch API: one input file of requests to one endpoint and model,
    run in spare capacity within its window at the batch price.

    `reservation` is the quota admission that holds the batch's maximum cost against the
    tenant's budgets (reserved at creation, settled line by line, so a runner on another
    process or after a restart settles the same one); the `price_*` columns are the batch
    price it was reserved at, so each line gives back exactly its own share. `held_*` and
    `spent_*` are the reservation's durable state (money in integer micro-units, exact on
    both databases): what it still holds and what its stored lines used, changed in each
    line's own transaction, versioned by `quota_version`; the quota store is brought to
    them (`QuotaBackend.resync`), so a store that lost them (a restart) gets them back. `lease_*`
    say which runner works the batch and until when it must renew (a runner that died
    lets the lease lapse, and another resumes the batch).
    """

    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    api_key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    endpoint: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(8), default="24h")
    # OpenAI's `output_expires_after` (anchor `created_at`): the output and error files
    # expire this many seconds after they are made; None: the files' retention.
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    batch_metadata: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    request_total: Mapped[int] = mapped_column(Integer, default=0)
    request_completed: Mapped[int] = mapped_column(Integer, default=0)
    request_failed: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    enqueued_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_charge: Mapped[Decimal] = mapped_column(MONEY, default=Decimal(0))
    reservation: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    held_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    held_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    spent_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    quota_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    price_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE, default=Decimal(0))
    price_cached_input_per_mtok: Mapped[Decimal] = mapped_column(PRICE, default=Decimal(0))
    price_output_per_mtok: Mapped[Decimal] = mapped_column(PRICE, default=Decimal(0))
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    in_progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finalizing_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    expired_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelling_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    cancelled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        CheckConstraint(f"status IN {BATCH_STATUSES}", name="status"),
        CheckConstraint(
            "request_completed >= 0 AND request_failed >= 0"
            " AND request_completed + request_failed <= request_total",
            name="counts",
        ),
        Index(None, "tenant_id", "created_at"),
        Index(None, "status", "lease_until"),
    )


class BatchLine(Base):
    """One finished line of a batch: its result (the output or error file's line, sealed,
    custom_id included) stored before it counts, so a resumed batch never runs it again.
    `request_id` keys the line's one ledger entry, written in the same transaction."""

    __tablename__ = "batch_lines"

    batch_id: Mapped[str] = mapped_column(
        ForeignKey("batches.id", ondelete="CASCADE"), primary_key=True
    )
    line: Mapped[int] = mapped_column(Integer, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int] = mapped_column(Integer)
    sealed: Mapped[bytes] = mapped_column(LargeBinary)
    finished_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (CheckConstraint("line >= 1", name="line"),)
