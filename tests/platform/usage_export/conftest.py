"""Fixtures: a migrated PostgreSQL database, and the Stripe-like receiver on a real socket."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reports"))  # report_factories
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "auth"))  # control_plane_helpers

from control_plane_helpers import ControlPlane, control_plane
from receiver import Receiver, running

from hydrant.platform.db.session import Database


@pytest.fixture()
def pg_url(fresh_postgres_url: str) -> str:
    from hydrant.platform.db import migrate

    migrate.upgrade(fresh_postgres_url)
    return fresh_postgres_url


@pytest.fixture()
async def pg(pg_url: str) -> AsyncIterator[Database]:
    database = Database(pg_url)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    with running(Receiver()) as live:
        yield live


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane
