"""Which exceptions mean "the database is not there", as opposed to a bug in a query."""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# `PoolTimeout` (no connection free in the pool) is SQLAlchemy's, not the builtin one.
DATABASE_UNAVAILABLE = (
    OperationalError,
    DBAPIError,
    PoolTimeout,
    OSError,
    TimeoutError,
    ConnectionError,
)
