"""What the ledger reads of a request and its end: the settlement side of the request path.

The request path calls `LedgerWriter.record` exactly once per request, whatever
happens (completion, stop, client disconnect, engine failure). The ledger
needs only who asked, for which model, and when: `Metered` names that much,
so the admission side's request context (quotas/admission.py) is written
against it without the ledger importing quotas.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Protocol

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.ledger.attribution import Attribution

EntryStatus = Literal["finished", "stopped", "aborted", "failed"]


class Metered(Protocol):
    """A request as its ledger entry names it; the request id keys the entry (idempotent)."""

    @property
    def request_id(self) -> str: ...

    @property
    def tenant_id(self) -> str: ...

    @property
    def api_key_id(self) -> str | None: ...

    @property
    def model(self) -> str: ...

    @property
    def adapter(self) -> str | None:
        """The LoRA adapter it ran with on `model` (None: the base model alone)."""
        ...

    @property
    def started_at(self) -> datetime: ...

    @property
    def attribution(self) -> Attribution | None:
        """Project, hashed end user and tags (None: none of them)."""
        ...


@dataclass
class Outcome:
    status: EntryStatus
    usage: RequestUsage
    finished_at: datetime


class LedgerWriter(Protocol):
    async def record(self, ctx: Metered, outcome: Outcome) -> None:
        """Write the request's one ledger entry (insert-if-absent by request id)."""
        ...
