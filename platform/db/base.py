"""Declarative base, naming convention and column types shared by every table.

The naming convention makes constraint names deterministic, so Alembic can
drop and alter them on both SQLite (batch mode) and PostgreSQL, and the
drift check compares like with like.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import DateTime, MetaData, Numeric
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Base(DeclarativeBase):
    metadata = metadata


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend.

    SQLite has no time zones: values are stored naive in UTC and come back
    aware, so comparisons and period boundaries mean the same on both databases.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; pass an aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Per-token prices are tiny (e.g. 0.15 per million tokens) and charges are summed
# over millions of entries: both are exact decimals, never floats.
PRICE = Numeric(20, 10, asdecimal=True)
MONEY = Numeric(20, 6, asdecimal=True)
SECONDS = Numeric(20, 9, asdecimal=True)


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    """Public, prefixed identifiers (`ten_…`, `key_…`): readable in logs, unguessable."""
    return f"{prefix}_{secrets.token_hex(12)}"


def as_decimal(value: Any) -> Decimal:
    """Money from the database or a request, refusing floats (they cannot be exact)."""
    if isinstance(value, float):
        raise TypeError("money must not be a float; pass a Decimal, int or str")
    return value if isinstance(value, Decimal) else Decimal(str(value))
