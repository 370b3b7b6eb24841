"""Fixtures: the digest tests' helpers (real SMTP server, ledger factories) on sys.path."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "digests"))

from smtp_inbox import SmtpServer, smtp_server

from hydrant.platform.db.session import Database


@pytest.fixture()
def smtp(tmp_path: Path) -> Iterator[SmtpServer]:
    with smtp_server(tmp_path) as server:
        yield server


@pytest.fixture()
async def db(database_url: str) -> AsyncIterator[Database]:
    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()
