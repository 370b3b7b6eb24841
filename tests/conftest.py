"""Shared fixtures: real services for integration tests, scratch directories.

A missing service is a skip on a developer's machine and a failure in CI
(`CI=true`), so a green CI run always means the integration tests ran.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from hydrant.platform.db.session import Database

# Triton reads TRITON_INTERPRET when a kernel is decorated, i.e. when any module that
# defines one is first imported, which other folders' tests may do before
# tests/kernels/ is collected: so it is set here, first. Only where no GPU exists;
# a value given in the environment wins.
if not glob.glob("/dev/nvidia[0-9]*"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

POSTGRES_HOST = os.environ.get("HYDRANT_TEST_PG_HOST", "127.0.0.1")
POSTGRES_PORT = int(os.environ.get("HYDRANT_TEST_PG_PORT", "5432"))
REDIS_HOST = os.environ.get("HYDRANT_TEST_REDIS_HOST", "127.0.0.1")
REDIS_PORT = int(os.environ.get("HYDRANT_TEST_REDIS_PORT", "6379"))


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def require_service(name: str, host: str, port: int) -> None:
    """Skip locally, fail in CI, when a service the test needs is down."""
    if _reachable(host, port):
        return
    message = f"{name} is not reachable at {host}:{port}"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{message} (CI=true: a missing service is a failure)")
    pytest.skip(message)


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """Base URL of the real PostgreSQL server (trust auth), without a database name."""
    require_service("PostgreSQL", POSTGRES_HOST, POSTGRES_PORT)
    return f"postgresql+asyncpg://postgres@{POSTGRES_HOST}:{POSTGRES_PORT}"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis server; tests use their own key prefixes or databases."""
    require_service("Redis", REDIS_HOST, REDIS_PORT)
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


@pytest.fixture()
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh data directory for one test."""
    path = tmp_path / "data"
    path.mkdir()
    yield path


def _postgres_admin(postgres_server: str, sql: str) -> None:
    """Run one statement on the server's `postgres` database (CREATE/DROP DATABASE)."""
    import asyncio

    import asyncpg

    async def run() -> None:
        connection = await asyncpg.connect(
            postgres_server.replace("postgresql+asyncpg", "postgresql") + "/postgres"
        )
        try:
            await connection.execute(sql)
        finally:
            await connection.close()

    asyncio.run(run())


@contextmanager
def _postgres_database(postgres_server: str, template: str | None = None) -> Iterator[str]:
    """A PostgreSQL database of its own (empty, or a copy of `template`), dropped after."""
    import secrets

    name = f"hydrant_t_{secrets.token_hex(6)}"
    copy = f' TEMPLATE "{template}"' if template is not None else ""
    _postgres_admin(postgres_server, f'CREATE DATABASE "{name}"{copy}')
    try:
        yield name
    finally:
        _postgres_admin(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def fresh_postgres_url(postgres_server: str) -> Iterator[str]:
    """An empty PostgreSQL database of its own, dropped after the test."""
    with _postgres_database(postgres_server) as name:
        yield f"{postgres_server}/{name}"


@pytest.fixture()
def fresh_sqlite_url(tmp_path: Path) -> str:
    return f"sqlite+aiosqlite:///{tmp_path / 'hydrant.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def empty_database_url(request: pytest.FixtureRequest) -> str:
    """An empty database on each backend: the embedded SQLite and the real PostgreSQL."""
    fixture = "fresh_sqlite_url" if request.param == "sqlite" else "fresh_postgres_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def migrated_sqlite_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file the migrations built, once a session; tests get copies of it."""
    from hydrant.platform.db import migrate

    path = tmp_path_factory.mktemp("migrated") / "hydrant.db"
    migrate.upgrade(f"sqlite+aiosqlite:///{path}")
    # Its engine closed, the database is the file alone: a copy of it is the whole of it.
    assert not path.with_name(path.name + "-wal").exists(), "the migrations left a WAL"
    return path


@pytest.fixture(scope="session")
def migrated_postgres_template(postgres_server: str) -> Iterator[str]:
    """A PostgreSQL database the migrations built, once a session, that tests' databases
    are created from (`CREATE DATABASE ... TEMPLATE`: a file copy, no migration run)."""
    from hydrant.platform.db import migrate

    with _postgres_database(postgres_server) as name:
        migrate.upgrade(f"{postgres_server}/{name}")
        yield name


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own on each backend with the schema the migrations build.

    The migrations run once a session per backend (`migrated_sqlite_file`,
    `migrated_postgres_template`) and each test gets a copy: running all of them for each
    of the ~430 tests that take this fixture was a third of a second each, two minutes of
    the suite. The migrations themselves are tested on empty databases
    (`empty_database_url`: tests/platform/db/test_migrations.py)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("migrated_sqlite_file")
        target = tmp_path / template.name
        shutil.copyfile(template, target)
        yield f"sqlite+aiosqlite:///{target}"
        return
    server: str = request.getfixturevalue("postgres_server")
    with _postgres_database(server, request.getfixturevalue("migrated_postgres_template")) as name:
        yield f"{server}/{name}"


@pytest.fixture()
async def db(database_url: str) -> AsyncIterator[Database]:
    """A `Database` on that migrated database, disposed after the test."""
    from hydrant.platform.db.session import Database

    database = Database(database_url)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated demo checkpoint, written once per test session."""
    from hydrant.engine.demo_model import write_demo_model

    return write_demo_model(tmp_path_factory.mktemp("models") / "demo")
