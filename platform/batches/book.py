"""Batches as their owners and operators read them: one, a page, cancelling, what one cost.

One object for every reader: `/v1/batches` (a key sees its tenant's batches only,
whatever else it may do), the console (`hydrant batches`, as the console principal:
every tenant's) and the `/ui` pages (a tenant its own, an admin anyone's). Scoping is
`auth.scoping`'s; another tenant's batch is a 404, as if absent. What a batch cost is
read from the ledger (its lines' entries), never kept beside it.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

from sqlalchemy import Select, update
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.auth.scoping import scope_to, scope_to_tenant
from hydrant.platform.batches import repository
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.batch_models import BATCH_STATUSES, Batch
from hydrant.platform.db.outage import session_or_unavailable
from hydrant.platform.db.pagination import MAX_PAGE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit

RUN_JOB = "hydrant.batches.run"
FINAL = ("completed", "failed", "expired", "cancelled")


def _missing(batch_id: str) -> NotFound:
    return NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")


class BatchBook:
    def __init__(
        self, database: Database, *, tenant_only: bool, enqueue: Enqueue | None = None
    ) -> None:
        self._database = database
        # True: only the principal's own tenant's batches, even for a key that is also an
        # admin's (OpenAI's API); False: `scope_to` (an admin sees every tenant's).
        self._tenant_only = tenant_only
        self.enqueue = enqueue  # sends the run job; None: the periodic sweep starts it

    def _session(self) -> AbstractAsyncContextManager[AsyncSession]:
        return session_or_unavailable(self._database, "batches")

    def _visible(self, statement: Select[Any], principal: Principal) -> Select[Any]:
        if self._tenant_only:
            return scope_to_tenant(statement, Batch, principal.tenant_id)
        return scope_to(statement, Batch, principal)

    async def get(self, principal: Principal, batch_id: str) -> Batch:
        async with self._session() as session:
            batch = await repository.one_batch(session, self._visible, principal, batch_id)
        if batch is None:
            raise _missing(batch_id)
        return batch

    async def page(
        self,
        principal: Principal,
        *,
        limit: int = 20,
        after: str | None = None,
        tenant_id: str | None = None,
        status: str | None = None,
    ) -> tuple[list[Batch], bool]:
        """OpenAI's cursor page, newest first; `tenant_id` and `status` narrow it."""
        if not 1 <= limit <= 100:
            raise InvalidRequest("limit must be between 1 and 100", param="limit")
        if status is not None and status not in BATCH_STATUSES:
            choices = ", ".join(BATCH_STATUSES)
            raise InvalidRequest(f"status must be one of {choices}", param="status")
        async with self._session() as session:
            rows, more = await repository.page_of_batches(
                session,
                self._visible,
                principal,
                limit=min(limit, MAX_PAGE),
                after=after,
                tenant_id=tenant_id,
                status=status,
            )
        return list(rows), more

    async def charged(self, batches: list[Batch]) -> dict[str, Decimal]:
        """What each batch's lines were charged so far (batches the caller could read):
        the sum of their ledger entries."""
        async with self._session() as session:
            return await repository.charged(session, [b.id for b in batches])

    async def cancel(self, principal: Principal, batch_id: str) -> Batch:
        """Stop a batch: no new line starts and the lines running stop (unbilled); it ends
        `cancelled` with what was served in its output file."""
        batch = await self.get(principal, batch_id)
        if batch.status in ("cancelling", "cancelled"):
            return batch
        if batch.status in FINAL:
            raise Conflict(f"a batch that is {batch.status} cannot be cancelled", param="batch_id")
        async with self._session() as session:
            await session.execute(
                update(Batch)
                .where(Batch.id == batch.id, Batch.status.in_(("validating", "in_progress")))
                .values(status="cancelling", cancelling_at=utcnow())
            )
            if self.enqueue is not None:  # its runner stops; with none running, one finishes it
                enqueue_after_commit(session, self.enqueue, RUN_JOB, batch_id=batch.id)
        return await self.get(principal, batch_id)
