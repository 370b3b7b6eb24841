"""Failure modes: closed refuses, open admits unmetered; an outage and its end are logged once."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

import pytest
from quota_helpers import ManualClock

from hydrant.platform.quotas import (
    Admission,
    Check,
    FailureMode,
    GuardedQuotaBackend,
    InMemoryQuotaBackend,
    LimitUsage,
    QuotaBackendUnavailable,
    QuotaExceeded,
    WindowCheck,
)
from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

CHECK = WindowCheck("rpm", "{t}:rpm", 2, 60.0)


class FlakyBackend(InMemoryQuotaBackend):
    """An in-memory store that can be switched off, like a Redis that went away."""

    def __init__(self) -> None:
        super().__init__(clock=ManualClock())
        self.down = False

    def _fail(self) -> None:
        if self.down:
            raise QuotaBackendUnavailable("Redis is unavailable: ConnectionError")

    async def admit(self, checks: Sequence[Check], reservation_id: str | None = None) -> Admission:
        self._fail()
        return await super().admit(checks, reservation_id)

    async def settle(self, admission: Admission, actual: Mapping[str, int] | None = None) -> None:
        self._fail()
        await super().settle(admission, actual)

    async def renew(self, admission: Admission) -> bool:
        self._fail()
        return await super().renew(admission)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "hydrant.platform.quotas.guard"]


async def test_fail_closed_raises_and_logs_the_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = FlakyBackend()
    guard = GuardedQuotaBackend(inner)
    assert guard.mode is FailureMode.CLOSED
    inner.down = True
    for _ in range(20):
        with pytest.raises(QuotaBackendUnavailable):
            await guard.admit([CHECK])
    messages = warnings_of(caplog)
    assert len(messages) == 1
    assert "fail closed" in messages[0]
    inner.down = False
    await guard.admit([CHECK])
    await guard.admit([CHECK])
    messages = warnings_of(caplog)
    assert len(messages) == 2
    assert "recovered after 20 failed calls" in messages[1]
    with pytest.raises(QuotaExceeded):  # limits apply again once it is back
        await guard.admit([CHECK])


async def test_fail_open_admits_unmetered_and_settles_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = FlakyBackend()
    guard = GuardedQuotaBackend(inner, "open")
    inner.down = True
    admissions = [await guard.admit([CHECK]) for _ in range(5)]
    assert all(not a.metered for a in admissions)
    inner.down = False
    for admission in admissions:
        await guard.settle(admission)
        assert admission.settled
        assert await guard.renew(admission) is False
    assert await guard.usage(CHECK) == LimitUsage(used=0)
    assert len(warnings_of(caplog)) == 2  # the outage, then the recovery
    assert "fail open" in warnings_of(caplog)[0]


async def test_settle_during_an_outage_does_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    inner = FlakyBackend()
    guard = GuardedQuotaBackend(inner, FailureMode.CLOSED)
    admission = await guard.admit([CHECK])
    inner.down = True
    await guard.settle(admission)
    assert admission.settled
    assert guard.outage.down
    assert len(warnings_of(caplog)) == 1


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        GuardedQuotaBackend(InMemoryQuotaBackend(), "sometimes")


async def test_fail_open_over_an_unreachable_redis() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    guard = GuardedQuotaBackend(RedisQuotaBackend.from_url(f"redis://127.0.0.1:{port}/0"), "open")
    admission = await guard.admit([CHECK])
    assert not admission.metered
    await guard.settle(admission)
    await guard.aclose()
