"""The ledger's own PostgreSQL connection for live writes: one round trip per group of entries.

Why: a live write waits for its entry to be durable before the response
completes, so everything around the commit is gateway overhead. Through the
ORM session, one group cost a pool checkout with its pre-ping, BEGIN, the
INSERT and COMMIT (four round trips) and ~0.5 ms of the event loop's CPU in
SQLAlchemy; here it is one autocommitted statement on a connection the ledger
keeps (`repository.insert_if_absent_pg`). Durability is the same: PostgreSQL
answers an autocommitted statement after its commit is flushed.

The connection is taken from the database's own pool (same URL, same
settings) and kept checked out; `Database.dispose` gives it back. Any error
other than the database refusing the rows (a constraint, bad data) drops it,
so the next write starts on a fresh, pre-pinged one, and errors come out as
the SQLAlchemy exceptions the ledger already sorts into "refused" and
"unavailable". One write at a time: while it is busy (a replay beside the
live writes), callers use the session path instead (`available`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy.exc import DataError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.session import Database
from hydrant.platform.ledger import repository

# What the driver raises when the link or the server is gone (a connection killed under
# it surfaces as an InternalClientError on the next use): "unavailable", so spooled.
_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError)


class PinnedWriter:
    """Insert-if-absent ledger rows on a kept PostgreSQL connection."""

    def __init__(self, database: Database) -> None:
        self._database = database
        self._connection: AsyncConnection | None = None
        self._busy = False
        self._closed = False
        database.on_dispose(self.aclose)

    @staticmethod
    def supports(database: Database) -> bool:
        return database.engine.dialect.driver == "asyncpg"

    @property
    def available(self) -> bool:
        return not (self._busy or self._closed)

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Insert the rows whose request id is new (one statement); how many were inserted."""
        if not self.available:
            raise RuntimeError("the pinned ledger connection is busy or closed")
        self._busy = True
        try:
            driver = await self._driver()
            try:
                return await repository.insert_if_absent_pg(driver, rows, utcnow())
            except asyncpg.IntegrityConstraintViolationError as exc:  # refused: keep the link
                raise IntegrityError(repository.PG_INSERT, None, exc) from exc
            except asyncpg.DataError as exc:
                raise DataError(repository.PG_INSERT, None, exc) from exc
            except BaseException as exc:  # outage, cancellation, anything: start afresh
                await self._drop()
                if isinstance(exc, _DRIVER_ERRORS):
                    raise OperationalError(repository.PG_INSERT, None, exc) from exc
                raise
        finally:
            self._busy = False

    async def _driver(self) -> Any:
        if self._connection is None:
            connection = await self._database.engine.connect()  # pre-pinged by the pool
            try:
                raw = await connection.get_raw_connection()
            except BaseException:
                await connection.close()
                raise
            self._connection = connection
        else:
            raw = await self._connection.get_raw_connection()
        return raw.driver_connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.invalidate()  # closed, not returned to the pool
            with contextlib.suppress(Exception):
                await connection.close()

    async def aclose(self) -> None:
        """Give the connection back to the pool; later writes go the session way."""
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                await connection.close()
