"""The SQLite connection pool keeps its connections: no thread is started again under load.

Each aiosqlite connection runs in a thread of its own, and opening one blocks the
event loop in `Thread.start()` until that thread runs (over a second was seen on a
busy 2-core host). With SQLAlchemy's default pool (5 kept, 10 more opened and
closed as load comes and goes) every burst past five sessions opened connections
again; the gateway's pool keeps every connection it opened instead.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from sqlalchemy import text

from hydrant.platform.db.session import SQLITE_POOL_SIZE, Database


def connection_threads() -> set[threading.Thread]:
    """The aiosqlite threads alive (the objects: an ended thread's ident can be reused)."""
    return {t for t in threading.enumerate() if "_connection_worker_thread" in t.name}


async def burst(db: Database, sessions: int) -> None:
    gate = asyncio.Event()

    async def one() -> None:
        async with db.session() as session:
            await session.execute(text("SELECT 1"))
            await gate.wait()  # every session is open at once

    tasks = [asyncio.create_task(one()) for _ in range(sessions)]
    await asyncio.sleep(0.2)
    gate.set()
    await asyncio.gather(*tasks)


async def test_a_second_burst_reuses_the_first_ones_connections(tmp_path: Path) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'pool.db'}")
    before = connection_threads()
    try:
        await burst(db, 12)  # past SQLAlchemy's default of 5 kept connections
        opened = connection_threads() - before
        assert len(opened) == 12
        await burst(db, 12)
        assert connection_threads() - before == opened  # the same threads, none new
    finally:
        await db.dispose()


async def test_sessions_past_the_cap_wait_for_a_connection_instead_of_failing(
    tmp_path: Path,
) -> None:
    db = Database(f"sqlite+aiosqlite:///{tmp_path / 'pool.db'}")
    before = connection_threads()
    try:
        await burst(db, SQLITE_POOL_SIZE + 5)  # five wait for the gate's first sessions
        assert len(connection_threads() - before) == SQLITE_POOL_SIZE
    finally:
        await db.dispose()
