"""The admission side of the request path: who asks for what, and the gate it passes.

Quotas and budgets (`Gatekeeper`) reserve before a request runs and settle
after it, exactly once whatever happens; the ledger (ledger/accounting.py)
records it. The inference API builds one `RequestContext` per request; these
layers sit below it and read it through the protocols here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from hydrant.engine.protocol import BACKGROUND_PRIORITY, Sampling
from hydrant.platform.billing.pricing import adapter_model_name
from hydrant.platform.db.base import utcnow
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.attribution import Attribution
from hydrant.platform.quotas.policy import KeyQuota, PlanPolicy, ProjectQuota

# The engine priority of a Batch API line: background, so the scheduler computes it only in
# steps where no interactive request runs, and preempts it first when KV blocks run out.
BATCH_PRIORITY = BACKGROUND_PRIORITY


class PromptShape(Protocol):
    """One prompt of a request, as quotas count it: its tokens and its sampling settings."""

    @property
    def token_ids(self) -> list[int]: ...

    @property
    def sampling(self) -> Sampling: ...


class Prepared(Protocol):
    """What admission and metering read of a prepared request. The inference API's
    `PreparedRequest` is one; these layers sit below it and do not import it."""

    @property
    def prompts(self) -> Sequence[PromptShape]: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def prompt_field(self) -> str: ...


P = TypeVar("P", bound=Prepared)


@dataclass(frozen=True)
class BatchTicket:
    """What makes a request a Batch API line: its batch. It takes the gate's batch lane,
    no interactive rate; its budget was reserved when its batch was made, and the runner
    settles the line's share once the line is stored."""

    batch_id: str


@dataclass
class RequestContext(Generic[P]):
    """Who asked for what; the request id keys the ledger entry (idempotent)."""

    request_id: str
    tenant_id: str
    api_key_id: str | None
    key_prefix: str
    model: str
    prepared: P
    tenant_weight: float = 1.0
    priority: int = 0
    plan: PlanPolicy | None = None
    max_model_len: int | None = None
    started_at: datetime = field(default_factory=utcnow)
    batch: BatchTicket | None = None  # a Batch API line: the gate's batch lane, not the rates
    # The LoRA adapter it runs with: `model` stays the base model (its pool, lanes, limits);
    # the price and the ledger entry name the adapter too.
    adapter: str | None = None
    # Below the tenant: the key's project, the hashed end user, the request's tags (ledger).
    attribution: Attribution | None = None
    # The key's project's budgets, checked beside the plan's tenant budgets (quotas/plan.py).
    project: ProjectQuota | None = None
    key_quota: KeyQuota | None = None  # the key's own budgets

    @property
    def public_model(self) -> str:
        """The model as the client named it in the answer: `base:adapter` for an adapter."""
        return adapter_model_name(self.model, self.adapter)


class Admission(Protocol):
    @property
    def rate_limit_headers(self) -> Mapping[str, str]:
        """OpenAI's `x-ratelimit-*` headers from the admission's own quota call (may be empty)."""
        ...

    async def settle(self, outcome: Outcome) -> None:
        """Give back what was reserved and charge what was used."""
        ...

    def close(self) -> None:
        """The request is over: settled, its ledger entry written, its answer complete but
        for the last bytes. Called once after `settle`, however the request ended."""
        ...


class Gatekeeper(Protocol):
    async def admit(self, ctx: RequestContext[Any]) -> Admission:
        """Reserve the request's limits and budget, or raise `RateLimited`/`BudgetExhausted`."""
        ...


class NoSettlement:
    @property
    def rate_limit_headers(self) -> Mapping[str, str]:
        return {}

    async def settle(self, outcome: Outcome) -> None:
        return None

    def close(self) -> None:
        return None


class OpenGate:
    """Admits everything: the gate used where no quota backend is configured (tests of the API)."""

    async def admit(self, ctx: RequestContext[Any]) -> Admission:
        return NoSettlement()
