"""The Batch API's tables (issue #27): files (migration 0006), batches and their lines.

Kept beside `models.py` (which imports this module, so every table is on the one
metadata) because they are one feature's tables and `models.py` is long enough.
A file's content and a line's result are tenant data: they are stored sealed
(`platform/sealing.py`), never in a plain column.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKey, Index, Integer, LargeBinary, String
from sqlalchemy.orm import Mapped, mapped_column

from hydrant.platform.db.base import Base, UTCDateTime, utcnow

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
