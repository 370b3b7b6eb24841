"""What the fault tests share: a private PostgreSQL fixture, load that survives a dead gateway.

The steady load, the ledger queries and the bounded waits come from
test_ledger_faults.py (the proxy-based outage test); this adds what a real
outage needs on top: a database process of the test's own, and clients that
record a dropped connection instead of raising when the gateway dies.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from private_services import PrivatePostgres, postgres_available, private_postgres
from test_ledger_faults import BODY

from hydrant.platform.keys import generate_key

KEY_CACHE_TTL_S = 10  # the most the gateway allows: outages in these tests stay well inside


@pytest.fixture()
def private_pg() -> Iterator[PrivatePostgres]:
    """A PostgreSQL cluster of this test's own, migrated, that the test may stop and start."""
    reason = postgres_available()
    if reason is not None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{reason} (CI=true: a missing service is a failure)")
        pytest.skip(reason)
    from hydrant.platform.db import migrate

    with private_postgres() as server:
        migrate.upgrade(server.url)
        yield server


def gateway_env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        "HYDRANT_DATABASE_URL": database_url,
        "HYDRANT_AUTO_MIGRATE": "false",
        "HYDRANT_SECRET_KEY": generate_key("test").secret,
        "HYDRANT_KEY_CACHE_TTL_S": str(KEY_CACHE_TTL_S),
        **extra,
    }


@dataclass
class Tally:
    """Every response of a load: status, request id, and the phase it was sent in."""

    statuses: list[tuple[str, int, str | None]] = field(default_factory=list)
    phase: str = "before"
    done: bool = False

    def ok_ids(self) -> set[str]:
        return {rid for _, status, rid in self.statuses if status == 200 and rid}

    def count(self, phase: str | None = None, status: int | None = None) -> int:
        return sum(
            1
            for p, s, _ in self.statuses
            if (phase is None or p == phase) and (status is None or s == status)
        )


async def steady_load(client: httpx.AsyncClient, key: str, tally: Tally, limit: int = 400) -> None:
    """One client sending `BODY` until told to stop; a dropped connection is status 0."""
    while not tally.done and len(tally.statuses) < limit:
        phase = tally.phase
        try:
            response = await client.post(
                "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"}
            )
            tally.statuses.append(
                (phase, response.status_code, response.headers.get("x-request-id"))
            )
        except httpx.HTTPError:
            tally.statuses.append((phase, 0, None))
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.05)


async def until(tally: Tally, phase: str, count: int, timeout_s: float = 60) -> None:
    """Wait (bounded) for `count` responses sent in `phase`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while tally.count(phase) < count:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"the load stalled in phase {phase}: {tally.count(phase)}")
        await asyncio.sleep(0.05)
