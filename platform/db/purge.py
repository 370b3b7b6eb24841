"""Deleting old rows a batch per transaction, for the retention jobs.

Why batches: a retention purge may meet months of rows the first time it runs; one
DELETE of them all would hold its locks (and, on SQLite, the whole database) for as
long as it takes and give no sign of progress. Each batch is its own short unit of
work, so writers interleave, a purge cut short keeps what it deleted, and the caller
hears after each batch how far it has got.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import ColumnElement, delete, func, inspect, select

from hydrant.platform.db.base import Base
from hydrant.platform.db.session import Database

PURGE_BATCH = 5000

# (rows deleted so far, rows there were to delete, at least as many as deleted)
Progress = Callable[[int, int], None]


async def delete_in_batches(
    database: Database,
    model: type[Base],
    where: tuple[ColumnElement[bool], ...],
    *,
    by: Any = None,
    batch: int = PURGE_BATCH,
    progress: Progress | None = None,
) -> int:
    """Delete the rows of `model` that match `where`; how many went. Each transaction takes
    `batch` distinct values of the column `by` (default: the one-column primary key, so
    `batch` rows; a day column groups a day's rows into one value)."""
    if by is None:
        [by] = inspect(model).primary_key
    async with database.session() as session:
        counted = await session.scalar(select(func.count()).select_from(model).where(*where))
    total = int(counted or 0)
    deleted = 0
    while True:
        async with database.session() as session:
            values = list(await session.scalars(select(by).where(*where).distinct().limit(batch)))
            if not values:
                return deleted
            result = await session.execute(delete(model).where(by.in_(values), *where))
        deleted += int(getattr(result, "rowcount", 0) or 0)
        if progress is not None:
            progress(deleted, max(total, deleted))  # rows may join while it runs
