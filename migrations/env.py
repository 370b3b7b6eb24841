"""Alembic environment: async engines, batch mode on SQLite, drift-aware comparisons."""

from __future__ import annotations

import asyncio
import logging

from alembic import context
from sqlalchemy.engine import Connection

import hydrant.platform.db.models  # noqa: F401  (registers the tables on the metadata)
from hydrant.platform.db.base import metadata
from hydrant.platform.db.session import make_engine

config = context.config
log = logging.getLogger("alembic.env")


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite cannot ALTER most things; batch mode rebuilds tables
        compare_type=True,
        compare_server_default=True,
        literal_binds=connection is None,
    )


def _run_sync(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
            await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    _configure(url=config.get_main_option("sqlalchemy.url"))
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_online())
