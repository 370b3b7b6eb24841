"""The interface every quota store implements: in-memory (embedded) and Redis (production).

Why one protocol with both behind it: the embedded default and production must
make the same decisions, so both run the same contract test suite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from hydrant.platform.quotas.checks import Admission, Check, LimitUsage


class QuotaBackend(Protocol):
    async def admit(self, checks: Sequence[Check], reservation_id: str | None = None) -> Admission:
        """Check and consume every limit atomically; raise `QuotaExceeded` consuming nothing.
        `reservation_id`: the id to hold it under (a batch's, written down before it is
        admitted, so a crash in between leaves a reservation that can be found); None: new."""
        ...

    async def settle(self, admission: Admission, actual: Mapping[str, int] | None = None) -> None:
        """Free the slots and settle reservations to the actual amounts (idempotent per object)."""
        ...

    async def resync(
        self,
        admission: Admission,
        version: int,
        held: Mapping[str, int],
        spent: Mapping[str, int],
    ) -> None:
        """Make a long-lived budget reservation (a Batch API batch's) what its durable record
        says at `version`: it holds `held` and has counted `spent` in all (per budget, by
        name). Absolute amounts under a version, not increments: applied only when newer
        than what the store has seen, so a retry, a late call or a call from a runner that
        resumed the batch changes nothing twice, and a store that lost the reservation (the
        in-memory store restarted, Redis without persistence) gets it back whole. Windows
        and slots are not touched."""
        ...

    async def renew(self, admission: Admission) -> bool:
        """Extend the leases of a long-running request; False if a lease had already expired."""
        ...

    async def usage(self, check: Check) -> LimitUsage:
        """How much of the check's limit is taken now (for pages, and for tests)."""
        ...

    async def aclose(self) -> None:
        """Release connections the backend owns."""
        ...
