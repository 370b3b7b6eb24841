"""The Batch API's rules: what a batch may hold, what it reserves, who sees it, cancelling.

Making a batch checks its whole file first (lines.py): a file with any bad line makes
a `failed` batch whose `errors` name the lines, before any work. A good file's batch
reserves its maximum cost at the model's batch price against the tenant's budgets (a
reservation over a budget refuses the batch: 429, nothing made) and its prompt tokens
against the plan's batch queue limit (`batch_queue_tokens`, per model, OpenAI's
enqueued-token limit), then starts `in_progress`; the runner (runner.py) does the rest.
A batch is its tenant's alone: another tenant's id is a 404.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal

from hydrant.platform.auth.principal import Principal
from hydrant.platform.batches import repository
from hydrant.platform.batches.book import RUN_JOB, BatchBook
from hydrant.platform.batches.lines import ENDPOINTS, Checked, check_file
from hydrant.platform.batches.reservation import released, to_json
from hydrant.platform.batches.schemas import BatchCreate
from hydrant.platform.billing.money import round_money
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
from hydrant.platform.quotas.checks import Admission
from hydrant.platform.quotas.credit_check import CREDIT, NO_CREDITS, CreditSource, CreditStanding
from hydrant.platform.quotas.plan import TenantQuota, batch_checks

log = logging.getLogger(__name__)

WINDOWS = {"24h": timedelta(hours=24)}
# The reservation outlives the window a little: a batch finishing at its deadline still
# settles against it (a reservation never settled is given back when this lapses).
RESERVATION_GRACE = timedelta(hours=1)
_BUDGET_WORDS = {
    "tokens_day": "daily token budget",
    "tokens_month": "monthly token budget",
    "spend_day": "daily spend budget",
    "spend_month": "monthly spend budget",
}


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
        await self._check_queue(principal, batch.model, checked)
        reserved_money = sum(
            (cost.money(price) for cost in checked.costs.values()), start=Decimal(0)
        )
        admission = await self._reserve(principal, checked, reserved_money, window)
        batch.status, batch.in_progress_at = "in_progress", now
        batch.request_total = len(checked.costs)
        batch.enqueued_tokens = checked.prompt_tokens
        batch.reserved_tokens = checked.tokens
        batch.reserved_charge = round_money(reserved_money)
        batch.reservation = to_json(admission) if admission is not None else None
        batch.price_input_per_mtok = price.input_per_million
        batch.price_cached_input_per_mtok = price.cached_rate
        batch.price_output_per_mtok = price.output_per_million
        try:
            async with self._session() as session:
                session.add(batch)
                if self.enqueue is not None:
                    enqueue_after_commit(session, self.enqueue, RUN_JOB, batch_id=batch.id)
        except BaseException:
            if admission is not None:  # not made: give the reservation back
                await self._backend.settle(admission, released(admission))
            raise
        log.info(
            "batch created",
            extra={"batch_id": batch.id, "tenant_id": tenant_id, "lines": batch.request_total},
        )
        return batch

    async def _check_queue(self, principal: Principal, model: str, checked: Checked) -> None:
        plan = principal.plan
        limit = plan.batch_queue_tokens if plan is not None else None
        if limit is None:
            return
        tenant_id = _tenant(principal)
        async with self._session() as session:
            queued = await repository.enqueued_tokens(session, tenant_id, model)
        if queued + checked.prompt_tokens > limit:
            raise RateLimited(
                f"enqueued token limit reached for {model}: this batch's {checked.prompt_tokens}"
                f" prompt tokens and the {queued} already queued exceed your plan's limit of "
                f"{limit}; retry when earlier batches have finished",
                code="token_limit_exceeded",
                retry_after=60,
            )

    async def _reserve(
        self, principal: Principal, checked: Checked, money: Decimal, window: timedelta
    ) -> Admission | None:
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
        )
        if not checks:
            return None
        try:
            return await self._backend.admit(checks)
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
