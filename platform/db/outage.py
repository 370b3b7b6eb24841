"""A unit of work for a request's reads and writes: the database away is a 503, not a 500.

Why a helper: every store a `/v1` route reads (stored answers, files, batches) must tell
a client "retry shortly" when the database is down, and none may answer a bare 500;
one context manager says so once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import ServiceUnavailable


@asynccontextmanager
async def session_or_unavailable(database: Database, what: str) -> AsyncIterator[AsyncSession]:
    """`database.session()`, with an outage raised as a 503 saying `what` cannot be reached."""
    try:
        async with database.session() as session:
            yield session
    except DATABASE_UNAVAILABLE as exc:
        raise ServiceUnavailable(f"{what} cannot be reached right now; retry shortly") from exc
