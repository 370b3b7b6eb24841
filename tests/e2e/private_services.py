"""PostgreSQL and Redis servers of a test's own, which the test may stop and start.

The shared servers on 5432/6379 serve every test and helper on the machine and
are never stopped; a fault test that needs a real outage (the process gone,
not a cut connection) starts its own instance on a free port in a temporary
folder and stops that one. PostgreSQL refuses to run as root, so its data
folder belongs to the `postgres` user and its commands run through `runuser`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from hydrant_server import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
REDIS_SERVER = shutil.which("redis-server")


def postgres_available() -> str | None:
    """Why a private PostgreSQL cannot run here, or None when it can."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL 15 binaries in {PG_BIN}"
    if shutil.which("runuser") is None or os.geteuid() != 0:
        return "a private PostgreSQL needs root and runuser (it runs as the postgres user)"
    return None


def _wait_port(port: int, up: bool, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                reachable = True
        except OSError:
            reachable = False
        if reachable == up:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} did not go {'up' if up else 'down'}")
        time.sleep(0.1)


class PrivatePostgres:
    """`initdb` once, then `start()`/`stop()` as often as the test wants (same port, same data)."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: its parents are root-only (0700), and the postgres
        # user must reach its data folder.
        self.root = Path(tempfile.mkdtemp(prefix="hydrant-pg-", dir="/tmp"))
        self.data = self.root / "pgdata"
        self.socket_dir = self.root / "sock"
        self.port = free_port()
        self.socket_dir.mkdir()
        for path in (self.root, self.socket_dir):
            shutil.chown(path, "postgres", "postgres")
        self._run(
            PG_BIN / "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )

    def _run(self, *argv: str | Path) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *map(str, argv)],
            check=True,
            capture_output=True,
            timeout=120,
        )

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(
            PG_BIN / "pg_ctl", "-D", str(self.data), "-o", options,
            "-l", str(self.root / "postgres.log"), "-w", "-t", "60", "start",
        )  # fmt: skip
        _wait_port(self.port, True, 30)

    def stop(self) -> None:
        """`-m fast`: open sessions are cut, as in a crash of the database service."""
        self._run(PG_BIN / "pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
        _wait_port(self.port, False, 30)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    server = PrivatePostgres()
    server.start()
    try:
        yield server
    finally:
        server.close()


class PrivateRedis:
    """A redis-server on a free port, no persistence; `stop()` and `start()` on the same port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.root),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_port(self.port, True, 30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        _wait_port(self.port, False, 30)


@contextlib.contextmanager
def private_redis(root: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(root)
    server.start()
    try:
        yield server
    finally:
        server.stop()
