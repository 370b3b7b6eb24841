"""The async engine and session factory, the same for SQLite and PostgreSQL.

One `Database` per process holds one connection pool; each request or job
opens one session (unit of work), committed on success, rolled back on error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

SQLITE_POOL_SIZE = 15


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Foreign keys are off by default in SQLite; WAL lets readers run beside the writer.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.close()


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for `url`; creates the SQLite file's folder when needed."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            # No overflow connections, only kept ones. Each aiosqlite connection is a thread,
            # and opening one blocks the event loop in `Thread.start()` until that thread
            # runs: with SQLAlchemy's default (5 kept, 10 more opened and closed as load
            # comes and goes) a busy gateway opened connections again and again, and on a
            # host whose cores an engine keeps busy one start blocked it for over a second.
            # The cap is the default's 15; past it a session waits (asynchronously).
            kwargs.setdefault("pool_size", SQLITE_POOL_SIZE)
            kwargs.setdefault("max_overflow", 0)
        engine = create_async_engine(url, **kwargs)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    return create_async_engine(url, **kwargs)


class Database:
    """The process's connection pool and its session factory."""

    def __init__(self, url: str, **engine_kwargs: Any) -> None:
        self.url = url
        self.engine = make_engine(url, **engine_kwargs)
        self.sessions = async_sessionmaker(self.engine, expire_on_commit=False)
        self._on_dispose: list[Callable[[], Awaitable[None]]] = []

    def on_dispose(self, close: Callable[[], Awaitable[None]]) -> None:
        """Run `close` first when the pool is disposed: for a connection a service keeps
        checked out (the ledger's, see ledger/pinned.py), so it is returned, not leaked."""
        self._on_dispose.append(close)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[AsyncSession]:
        """One unit of work: commit when the block succeeds, roll back when it raises."""
        async with self.sessions() as session:
            try:
                yield session
                await session.commit()
            except BaseException:
                await session.rollback()
                raise

    async def ping(self) -> None:
        """Raise if the database cannot answer a trivial query."""
        async with self.engine.connect() as connection:
            await connection.execute(text("SELECT 1"))

    async def dispose(self) -> None:
        closers, self._on_dispose = self._on_dispose, []
        for close in closers:
            await close()
        await self.engine.dispose()
