"""What to do when the quota store is down: fail closed (refuse) or fail open (serve unmetered).

Why a wrapper: the choice is policy, not storage, so it sits in one place for
every backend. Why log once: during an outage every request would log the same
line and drown the log (and the disk); one warning when it starts, one line
when it recovers with how many calls failed in between, says everything.
Settling never raises: the request has already been served, and unsettled
slots and reservations expire with their leases.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from enum import StrEnum

from hydrant.platform.quotas.backend import QuotaBackend
from hydrant.platform.quotas.checks import (
    Admission,
    Check,
    LimitUsage,
    QuotaBackendUnavailable,
    validate_checks,
)

_log = logging.getLogger(__name__)


class FailureMode(StrEnum):
    """Matches the `redis_failure_mode` setting's values."""

    CLOSED = "closed"
    OPEN = "open"


class OutageLog:
    """Logs the first failure of an outage and the recovery, nothing in between."""

    def __init__(self, what: str, logger: logging.Logger = _log) -> None:
        self._what = what
        self._logger = logger
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.failures > 0

    def failure(self, exc: BaseException, consequence: str) -> None:
        if self.failures == 0:
            self._logger.warning(
                "%s unavailable (%s); %s until it recovers",
                self._what,
                type(exc).__name__,
                consequence,
            )
        self.failures += 1

    def success(self) -> None:
        if self.failures:
            self._logger.warning("%s recovered after %d failed calls", self._what, self.failures)
            self.failures = 0


class GuardedQuotaBackend:
    """A `QuotaBackend` that applies the failure mode to an inner backend's outages."""

    def __init__(
        self,
        inner: QuotaBackend,
        mode: FailureMode | str = FailureMode.CLOSED,
        *,
        logger: logging.Logger = _log,
    ) -> None:
        self._inner = inner
        self.mode = FailureMode(mode)
        self.outage = OutageLog("quota backend", logger)

    @property
    def _consequence(self) -> str:
        if self.mode is FailureMode.CLOSED:
            return "refusing requests (fail closed)"
        return "admitting requests without limits (fail open)"

    async def admit(self, checks: Sequence[Check], reservation_id: str | None = None) -> Admission:
        try:
            admission = await self._inner.admit(checks, reservation_id)
        except QuotaBackendUnavailable as exc:
            self.outage.failure(exc, self._consequence)
            if self.mode is FailureMode.CLOSED:
                raise
            return Admission(
                reservation_id=reservation_id or uuid.uuid4().hex,
                checks=validate_checks(checks),
                metered=False,
            )
        self.outage.success()
        return admission

    async def settle(self, admission: Admission, actual: Mapping[str, int] | None = None) -> None:
        try:
            await self._inner.settle(admission, actual)
        except QuotaBackendUnavailable as exc:
            self.outage.failure(exc, self._consequence)
            # A timeout may hide a settle that ran: retrying could count it twice. Leases expire.
            admission.settled = True
            return
        self.outage.success()

    async def resync(
        self,
        admission: Admission,
        version: int,
        held: Mapping[str, int],
        spent: Mapping[str, int],
    ) -> None:
        try:
            await self._inner.resync(admission, version, held, spent)
        except QuotaBackendUnavailable as exc:
            # Never raised: the batch's row keeps the state, and the next line's resync (or
            # the batch's finish) brings the store to it, whatever this one missed.
            self.outage.failure(exc, self._consequence)
            return
        self.outage.success()

    async def renew(self, admission: Admission) -> bool:
        try:
            held = await self._inner.renew(admission)
        except QuotaBackendUnavailable as exc:
            self.outage.failure(exc, self._consequence)
            return False
        self.outage.success()
        return held

    async def usage(self, check: Check) -> LimitUsage:
        return await self._inner.usage(check)

    async def aclose(self) -> None:
        await self._inner.aclose()
