"""The two hooks every request passes through: admission before, settlement after.

Quotas and budgets (`Gatekeeper`) and the cost ledger (`LedgerWriter`) plug
in here, so the request path calls each exactly once per request whatever
happens: completion, stop, client disconnect, engine failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from hydrant.engine.protocol import RequestUsage
from hydrant.platform.db.base import utcnow
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.tenants.policy import PlanPolicy

EntryStatus = Literal["finished", "stopped", "aborted", "failed"]


@dataclass
class RequestContext:
    """Who asked for what; the request id keys the ledger entry (idempotent)."""

    request_id: str
    tenant_id: str
    api_key_id: str | None
    key_prefix: str
    model: str
    prepared: PreparedRequest
    tenant_weight: float = 1.0
    priority: int = 0
    plan: PlanPolicy | None = None
    max_model_len: int | None = None
    started_at: datetime = field(default_factory=utcnow)


@dataclass
class Outcome:
    status: EntryStatus
    usage: RequestUsage
    finished_at: datetime


class Admission(Protocol):
    async def settle(self, outcome: Outcome) -> None:
        """Give back what was reserved and charge what was used."""
        ...


class Gatekeeper(Protocol):
    async def admit(self, ctx: RequestContext) -> Admission:
        """Reserve the request's limits and budget, or raise `RateLimited`/`BudgetExhausted`."""
        ...


class LedgerWriter(Protocol):
    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        """Write the request's one ledger entry (insert-if-absent by request id)."""
        ...


class NoSettlement:
    async def settle(self, outcome: Outcome) -> None:
        return None


class OpenGate:
    """Admits everything: the gate used where no quota backend is configured (tests of the API)."""

    async def admit(self, ctx: RequestContext) -> Admission:
        return NoSettlement()
