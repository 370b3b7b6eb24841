"""The Batch API's rules: what a batch may hold, what it reserves, who sees it, cancelling.

Making a batch checks its whole file first (lines.py): a file with any bad line makes
a `failed` batch whose `errors` name the lines, before any work. A good file's batch is
written `validating` with its prompt tokens counted against the plan's batch queue limit
(`batch_queue_tokens`, per model, OpenAI's enqueued-token limit; checked atomically with
the write) and its reservation named on it; then its maximum cost at the model's batch
price is reserved against the budgets of the tenant, of the key's project and of the key
itself under the batch's id, as for an interactive request (over a budget: 429,
the row removed, nothing made), and it starts `in_progress`; the runner (runner.py) does
the rest. A gateway dying between the write and the start leaves a `validating` batch
the sweep fails, giving its reservation back (repository.CREATION_GRACE). A batch is its
tenant's alone: another tenant's id is a 404.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.batches import repository
from hydrant.platform.batches.book import RUN_JOB, BatchBook
from hydrant.platform.batches.lines import ENDPOINTS, Checked, check_file
from hydrant.platform.batches.reservation import release_unused, to_json
from hydrant.platform.batches.schemas import BatchCreate
from hydrant.platform.billing.money import from_micro_units, round_money
from hydrant.platform.billing.pricing import Price, price_of
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.batch_models import Batch
from hydrant.platform.db.session import Database
from hydrant.platform.errors import (
    BudgetExhausted,
    InsufficientQuota,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
)
from hydrant.platform.files.service import FileStore
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.quotas import QuotaBackend, QuotaBackendUnavailable, QuotaExceeded
from hydrant.platform.quotas.checks import Admission, BudgetCheck
from hydrant.platform.quotas.credit_check import CREDIT, NO_CREDITS, CreditSource, CreditStanding
from hydrant.platform.quotas.plan import TenantQuota, batch_checks

log = logging.getLogger(__name__)

WINDOWS = {"24h": timedelta(hours=24)}
# The reservation outlives the window a little: a batch finishing at its deadline still
# settles against it (a reservation never settled is given back when this lapses).
RESERVATION_GRACE = timedelta(hours=1)
OUTPUT_EXPIRY_S = (3600, 30 * 86400)  # OpenAI's bounds of `output_expires_after.seconds`
_BUDGET_WORDS = {
    "tokens_day": "daily token budget",
    "tokens_month": "monthly token budget",
    "spend_day": "daily spend budget",
    "spend_month": "monthly spend budget",
    "project_tokens_day": "project's daily token budget",
    "project_tokens_month": "project's monthly token budget",
    "project_spend_day": "project's daily spend budget",
    "project_spend_month": "project's monthly spend budget",
    "key_tokens_day": "API key's daily token budget",
    "key_tokens_month": "API key's monthly token budget",
    "key_spend_day": "API key's daily spend budget",
    "key_spend_month": "API key's monthly spend budget",
}


def _output_expiry(value: dict[str, Any] | None) -> int | None:
    """OpenAI's `output_expires_after`: seconds after each output or error file is made
    (anchor `created_at`, the file's) that it expires, 1 hour to 30 days; None: not set."""
    if value is None:
        return None
    unknown = set(value) - {"anchor", "seconds"}
    if unknown:
        raise InvalidRequest(
            f"output_expires_after has no field {sorted(unknown)[0]!r}",
            param=f"output_expires_after.{sorted(unknown)[0]}",
        )
    if value.get("anchor") != "created_at":
        raise InvalidRequest(
            "output_expires_after.anchor must be created_at", param="output_expires_after.anchor"
        )
    seconds = value.get("seconds")
    low, high = OUTPUT_EXPIRY_S
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not low <= seconds <= high:
        raise InvalidRequest(
            f"output_expires_after.seconds must be an integer between {low} (1 hour) and "
            f"{high} (30 days)",
            param="output_expires_after.seconds",
        )
    return seconds


def _tenant(principal: Principal) -> str:
    if principal.tenant_id is None:
        raise PermissionDenied("batches belong to a tenant, and this key has none")
    return principal.tenant_id


class BatchService(BatchBook):
    """`/v1/batches`: a tenant's own batches (`BatchBook`, tenant-only), and making them."""

    def __init__(
        self,
        database: Database,
        files: FileStore,
        api: InferenceApi,
        backend: QuotaBackend,
        batch_prices: Callable[[str], Price | None],
        *,
        enqueue: Enqueue | None = None,
        credit_source: CreditSource | None = None,
    ) -> None:
        super().__init__(database, tenant_only=True, enqueue=enqueue)
        self._files = files
        self._api = api
        self._backend = backend
        self._credit_source = credit_source  # a prepaid tenant's batch reserves its credits
        self._batch_price = batch_prices  # the price book's `batch`: a model's batch price

    async def create(self, principal: Principal, body: BatchCreate) -> Batch:
        tenant_id = _tenant(principal)
        if body.endpoint not in ENDPOINTS:
            raise InvalidRequest(
                f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint"
            )
        window = WINDOWS.get(body.completion_window)
        if window is None:
            raise InvalidRequest("completion_window must be 24h", param="completion_window")
        output_expires_after_s = _output_expiry(body.output_expires_after)
        try:
            file = await self._files.get(tenant_id, body.input_file_id)
        except NotFound:
            raise NotFound(
                f"No such File object: {body.input_file_id}", param="input_file_id"
            ) from None
        if file.purpose != "batch":
            raise InvalidRequest("the input file's purpose must be batch", param="input_file_id")
        content = await self._files.content(tenant_id, file.id)
        checked = await asyncio.to_thread(check_file, content, body.endpoint, self._api, principal)
        now = utcnow()
        batch = Batch(
            id=f"batch_{secrets.token_hex(12)}",
            tenant_id=tenant_id,
            api_key_id=principal.key_id if principal.key_id.startswith("key_") else None,
            endpoint=body.endpoint,
            model=checked.model or "",
            input_file_id=file.id,
            completion_window=body.completion_window,
            output_expires_after_s=output_expires_after_s,
            batch_metadata=body.metadata,
            created_at=now,
            expires_at=now + window,
        )
        if checked.errors:  # failed before any work: nothing reserved, nothing queued
            batch.status, batch.failed_at = "failed", now
            batch.errors = [error.as_dict() for error in checked.errors]
            async with self._session() as session:
                session.add(batch)
            return batch
        # An adapter's own batch price when it has one, else its base model's.
        adapter = checked.adapter.rpartition(":")[2] if checked.adapter else None
        price = price_of(self._batch_price, batch.model, adapter) or Price(Decimal(0), Decimal(0))
        micros = sum(cost.micros(price) for cost in checked.costs.values())
        reserved_money = from_micro_units(micros)
        checks, standing = await self._checks(principal, checked, reserved_money, window)
        batch.status = "validating"  # until its reservation is held
        batch.request_total = len(checked.costs)
        batch.enqueued_tokens = checked.prompt_tokens
        batch.reserved_tokens = batch.held_tokens = checked.tokens
        batch.reserved_charge, batch.held_micros = reserved_money, micros
        # Written down before it is admitted, under the batch's id: a crash in between
        # leaves a `validating` batch that names it, which the sweep fails and releases.
        unadmitted = Admission(reservation_id=batch.id, checks=checks)
        batch.reservation = to_json(unadmitted) if checks else None
        batch.price_input_per_mtok = price.input_per_million
        batch.price_cached_input_per_mtok = price.cached_rate
        batch.price_output_per_mtok = price.output_per_million
        async with self._session() as session:
            await self._enqueue_within_limit(session, principal, batch)
        try:
            admission = await self._admit(
                principal, checked, reserved_money, checks, standing, batch.id
            )
        except BaseException:
            try:  # refused: nothing is made
                async with self._session() as session:
                    await repository.forget_unstarted(session, batch.id)
            except Exception:  # left `validating`: the sweep fails it; the refusal stands
                log.warning("a refused batch could not be removed", extra={"batch_id": batch.id})
            raise
        reservation = to_json(admission) if admission is not None else None
        try:
            async with self._session() as session:
                if not await repository.start(session, batch.id, now, reservation):
                    raise ServiceUnavailable(  # the sweep took it for an interrupted one
                        "the batch could not be started in time; create it again",
                        retry_after=2,
                    )
                if self.enqueue is not None:
                    enqueue_after_commit(session, self.enqueue, RUN_JOB, batch_id=batch.id)
        except BaseException:
            await release_unused(self._backend, reservation)  # not made: given back
            raise
        batch.status, batch.in_progress_at, batch.reservation = "in_progress", now, reservation
        log.info(
            "batch created",
            extra={"batch_id": batch.id, "tenant_id": tenant_id, "lines": batch.request_total},
        )
        return batch

    async def _enqueue_within_limit(
        self, session: AsyncSession, principal: Principal, batch: Batch
    ) -> None:
        """Add the batch, refused if its prompt tokens and those its tenant has queued for
        the model pass the plan's batch queue limit. Atomic against concurrent creates:
        the tenant's row is locked first (PostgreSQL), and the batch is written before the
        sum is read (on SQLite the write takes the database's one write lock), so the sum
        counts every batch made before this one and none made after can pass unseen."""
        plan = principal.plan
        limit = plan.batch_queue_tokens if plan is not None else None
        if limit is None:
            session.add(batch)
            return
        # The lock before the insert: the insert's foreign key check share-locks the row,
        # and two transactions holding that would deadlock on each other's FOR UPDATE.
        await repository.lock_tenant(session, batch.tenant_id)
        session.add(batch)
        await session.flush()
        queued = await repository.enqueued_tokens(session, batch.tenant_id, batch.model)
        if queued > limit:
            raise RateLimited(
                f"enqueued token limit reached for {batch.model}: this batch's "
                f"{batch.enqueued_tokens} prompt tokens and the {queued - batch.enqueued_tokens}"
                f" already queued exceed your plan's limit of {limit}; retry when earlier "
                "batches have finished",
                code="token_limit_exceeded",
                retry_after=60,
            )

    async def _checks(
        self, principal: Principal, checked: Checked, money: Decimal, window: timedelta
    ) -> tuple[tuple[BudgetCheck, ...], CreditStanding | None]:
        """What the batch reserves (its tenant's budgets, its key's project's and the key's
        own, a prepaid tenant's credits) for its whole window, and the prepaid standing it
        was measured against. The project and key budgets are the principal's, as the
        interactive path reads them: a batch and interactive requests share their counters."""
        standing: CreditStanding | None = None
        if principal.plan is not None and principal.plan.prepaid:
            standing = NO_CREDITS
            if self._credit_source is not None:
                standing = await self._credit_source.standing(_tenant(principal))
        checks = batch_checks(
            tenant_id=_tenant(principal),
            quota=TenantQuota.of(principal.plan),
            reserve_tokens=checked.tokens,
            reserve_money=money,
            at=utcnow(),
            lease_s=(window + RESERVATION_GRACE).total_seconds(),
            credit=standing,
            project=principal.project,
            key_quota=principal.key_quota,
        )
        return checks, standing

    async def _admit(
        self,
        principal: Principal,
        checked: Checked,
        money: Decimal,
        checks: tuple[BudgetCheck, ...],
        standing: CreditStanding | None,
        batch_id: str,
    ) -> Admission | None:
        if not checks:
            return None
        try:
            return await self._backend.admit(checks, batch_id)
        except QuotaExceeded as exc:
            refusal = exc.refusal
            if standing is not None and any(r.limit_name == CREDIT for r in exc.refusals):
                if self._credit_source is not None:
                    self._credit_source.forget(_tenant(principal))
                raise InsufficientQuota(
                    f"You exceeded your current quota: your prepaid balance is "
                    f"{round_money(standing.balance)} {standing.currency} and this batch could "
                    f"cost up to {round_money(money)} {standing.currency} at the batch price "
                    f"(less what requests in progress hold); add credits or split the batch"
                ) from exc
            words = _BUDGET_WORDS.get(refusal.limit_name, refusal.limit_name)
            raise BudgetExhausted(
                f"the batch's maximum cost ({round_money(money)} for up to {checked.tokens} "
                f"tokens at the batch price) does not fit in your {words} "
                f"({refusal.limit_name}); split the batch or wait for the budget to renew",
                code=refusal.limit_name,
                retry_after=refusal.retry_after_s,
            ) from exc
        except QuotaBackendUnavailable as exc:
            raise ServiceUnavailable(
                "the quota service is unavailable; batches are refused until it recovers",
                code="quota_unavailable",
                retry_after=2,
            ) from exc
