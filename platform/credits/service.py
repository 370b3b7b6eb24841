"""Prepaid credits: grant, void, list, the balance, and paying ledger entries from grants.

A balance is never stored. It is the grants less their applications, and the
applications are derived from the ledger: each charged entry of a tenant with grants,
from its first grant on, is split over its grants (allocation.py) once, keyed by its
request id (`credit_settlements`), in a transaction that holds the tenant's row lock.
So the ledger stays the one source of truth and a replayed or late entry is paid
exactly once, whenever it lands. Admission (quotas/credit_check.py) reserves each
request's maximum cost against the standing read here, so the balance cannot be
overdrawn by concurrent requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.billing.money import round_money
from hydrant.platform.credits import repository
from hydrant.platform.credits.allocation import GrantFunds, allocate
from hydrant.platform.credits.low_balance import MAX_THRESHOLDS, replace_thresholds, thresholds_of
from hydrant.platform.credits.repository import GrantRow
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.credit_models import (
    CREDIT_KINDS,
    CreditAlertThreshold,
    CreditApplication,
    CreditGrant,
    CreditSettlement,
)
from hydrant.platform.db.session import Database
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound
from hydrant.platform.quotas.admission import RequestContext
from hydrant.platform.quotas.credit_check import CreditStanding
from hydrant.platform.tenants.repository import get_tenant

log = logging.getLogger(__name__)

DEFAULT_CURRENCY = "USD"
# How long a gateway reuses a tenant's grants at admission (see `CreditBook`).
STANDING_CACHE_S = 1.0
MAX_GRANT = Decimal("1000000000")  # a billion: micro-units stay far below 2**53 in Redis


def live(grant: CreditGrant, now: datetime) -> bool:
    return grant.voided_at is None and (grant.expires_at is None or grant.expires_at > now)


def remaining(row: GrantRow, now: datetime) -> Decimal:
    """What a grant can still pay now: nothing once voided or expired."""
    if not live(row.grant, now):
        return Decimal(0)
    return max(Decimal(0), row.grant.amount - row.used)


def standing_of(rows: Sequence[GrantRow], unpaid: Decimal, now: datetime) -> CreditStanding:
    """The standing admission checks against: `limit - spent` is what is left of the live
    grants. A dead grant counts only what it paid (the rest is gone); what no grant paid
    counts on both sides, so it neither adds to nor takes from the balance."""
    spent = sum((row.used for row in rows), Decimal(0)) + unpaid
    left = sum((remaining(row, now) for row in rows), Decimal(0))
    currency = rows[0].grant.currency if rows else DEFAULT_CURRENCY
    return CreditStanding(limit=spent + left, spent=spent, currency=currency)


async def read_standing(session: AsyncSession, tenant_id: str, now: datetime) -> CreditStanding:
    rows = await repository.grants_with_use(session, tenant_id)
    return standing_of(rows, await repository.unpaid_total(session, tenant_id), now)


async def apply_entries(
    session: AsyncSession,
    tenant_id: str,
    now: datetime,
    request_ids: Sequence[str] | None = None,
) -> int:
    """Pay the tenant's unapplied ledger entries from its grants, oldest entry first; how
    many entries were applied. Idempotent: an applied entry is never applied again."""
    if not await repository.lock_tenant(session, tenant_id):
        return 0
    rows = await repository.grants_with_use(session, tenant_id)
    if not rows:
        return 0
    since = min(row.grant.created_at for row in rows)
    entries = await repository.pending_entries(session, tenant_id, since, request_ids)
    if not entries:
        return 0
    # The settlements first, in a flush of their own: their primary keys are the guard (a
    # payer that raced us fails on them, and retries), and the applications refer to them.
    session.add_all(
        CreditSettlement(
            request_id=e.request_id, tenant_id=tenant_id, amount=e.charged, applied_at=now
        )
        for e in entries
    )
    await session.flush()
    funds = {row.grant.id: row for row in rows}
    left = {gid: row.grant.amount - row.used for gid, row in funds.items()}
    for entry in entries:
        grants = [
            GrantFunds(
                gid,
                row.grant.kind,
                left[gid] if row.grant.voided_at is None else Decimal(0),
                row.grant.expires_at,
                row.grant.created_at,
            )
            for gid, row in funds.items()
        ]
        allocation = allocate(entry.charged, grants, entry.finished_at)
        parts: list[tuple[str | None, Decimal]] = list(allocation.parts)
        for grant_id, amount in allocation.parts:
            left[grant_id] -= amount
        if allocation.unpaid > 0:
            log.warning(
                "a prepaid charge exceeded the tenant's credits",
                extra={"tenant_id": tenant_id, "request_id": entry.request_id},
            )
            parts.append((None, allocation.unpaid))
        session.add_all(
            CreditApplication(
                tenant_id=tenant_id,
                request_id=entry.request_id,
                grant_id=grant_id,
                amount=amount,
                applied_at=now,
            )
            for grant_id, amount in parts
        )
    await session.flush()
    return len(entries)


async def pay_pending(
    database: Database,
    tenant_id: str,
    now: datetime,
    request_ids: Sequence[str] | None = None,
) -> int:
    """`apply_entries` in a unit of work of its own, committed before the caller reads.
    PostgreSQL orders payers by the tenant's row lock; SQLite (no row locks) by the
    settlement's primary key: a payer that raced another is refused at commit and
    tries once more, on a fresh read that no longer holds the entries it lost."""
    for attempt in (1, 2):
        try:
            async with database.session() as session:
                return await apply_entries(session, tenant_id, now, request_ids)
        except IntegrityError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Balance:
    tenant_id: str
    currency: str
    available: Decimal
    grants: list[tuple[GrantRow, Decimal]]  # each grant with what it can still pay


class CreditService:
    """The admin and account API's rules, on the request's one unit of work."""

    def __init__(
        self,
        session: AsyncSession,
        database: Database,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._session = session
        self._database = database  # paying pending entries is a unit of work of its own
        self._clock = clock

    async def _tenant(self, principal: Principal, tenant_id: str) -> str:
        tenant = await get_tenant(self._session, principal, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        return tenant.id

    async def grant(
        self,
        principal: Principal,
        tenant_id: str,
        *,
        kind: str,
        amount: Decimal,
        currency: str = DEFAULT_CURRENCY,
        expires_at: datetime | None = None,
        note: str = "",
    ) -> tuple[GrantRow, Decimal]:
        """A new grant, and what it can pay (all of it)."""
        tenant = await self._tenant(principal, tenant_id)
        if kind not in CREDIT_KINDS:
            raise InvalidRequest("kind must be 'paid' or 'promo'", param="kind")
        if amount <= 0 or amount > MAX_GRANT or round_money(amount) != amount:
            raise InvalidRequest(
                "amount must be positive, at most 1e9, with at most 6 decimals", param="amount"
            )
        now = self._clock()
        if expires_at is not None and expires_at <= now:
            raise InvalidRequest("expires_at must be in the future", param="expires_at")
        currency = currency.upper()
        rows = await repository.grants_with_use(self._session, tenant)
        if rows and rows[0].grant.currency != currency:
            raise Conflict(
                f"this tenant's credits are in {rows[0].grant.currency}, not {currency}",
                param="currency",
            )
        grant = CreditGrant(
            tenant_id=tenant,
            kind=kind,
            amount=amount,
            currency=currency,
            expires_at=expires_at,
            note=note,
            created_at=now,
        )
        self._session.add(grant)
        await self._session.flush()
        return GrantRow(grant, Decimal(0)), amount

    async def void(
        self, principal: Principal, tenant_id: str, grant_id: str
    ) -> tuple[GrantRow, Decimal]:
        """What is left of the grant can no longer be spent (what it paid stays paid)."""
        grant = await repository.get_grant(self._session, principal, grant_id)
        if grant is None or grant.tenant_id != tenant_id:
            raise NotFound(f"no credit grant {grant_id!r}", param="grant_id")
        if grant.voided_at is None:
            grant.voided_at = self._clock()
            await self._session.flush()
        rows = await repository.grants_with_use(self._session, grant.tenant_id)
        row = next(r for r in rows if r.grant.id == grant.id)
        return row, remaining(row, self._clock())

    async def balance(self, principal: Principal, tenant_id: str) -> Balance:
        """The tenant's grants and balance, its pending ledger entries paid first (so the
        balance is exact even for entries that reached the ledger late, from the spool)."""
        tenant = await self._tenant(principal, tenant_id)
        now = self._clock()
        await pay_pending(self._database, tenant, now)
        rows = await repository.grants_with_use(self._session, tenant)
        standing = standing_of(rows, await repository.unpaid_total(self._session, tenant), now)
        return Balance(
            tenant_id=tenant,
            currency=standing.currency,
            available=standing.balance,
            grants=[(row, remaining(row, now)) for row in rows],
        )

    async def alert_thresholds(
        self, principal: Principal, tenant_id: str
    ) -> tuple[str, list[CreditAlertThreshold]]:
        """The tenant's low-balance thresholds, highest first, and its credits' currency."""
        tenant = await self._tenant(principal, tenant_id)
        rows = await repository.grants_with_use(self._session, tenant)
        currency = rows[0].grant.currency if rows else DEFAULT_CURRENCY
        return currency, await thresholds_of(self._session, tenant)

    async def set_alert_thresholds(
        self, principal: Principal, tenant_id: str, amounts: Sequence[Decimal]
    ) -> tuple[str, list[CreditAlertThreshold]]:
        """Replace the tenant's thresholds (an empty list turns the alerts off)."""
        tenant = await self._tenant(principal, tenant_id)
        if len(set(amounts)) > MAX_THRESHOLDS:
            raise InvalidRequest(
                f"at most {MAX_THRESHOLDS} thresholds per tenant", param="thresholds"
            )
        for amount in amounts:
            if amount <= 0 or amount > MAX_GRANT or round_money(amount) != amount:
                raise InvalidRequest(
                    "each threshold must be positive, at most 1e9, with at most 6 decimals",
                    param="thresholds",
                )
        await replace_thresholds(self._session, tenant, [a.normalize() for a in amounts])
        return await self.alert_thresholds(principal, tenant)


class CreditBook:
    """The request path's side of credits, on its own sessions: the standing admission
    reserves against (`CreditSource`), and paying an entry once the ledger has it.

    The grants are read at most once a second per tenant (`cache_s`), not per request:
    the read costs a few milliseconds on PostgreSQL. A copy is safe to reuse because the
    standing is computed from it at the moment of use (expiry is exact) and every way it
    goes stale under-states what may be spent (a grant not yet seen, spend not yet
    counted), except a void, which takes effect within `cache_s`. A credit refusal drops
    the copy (`forget`), so a top-up counts at the very next request.
    """

    def __init__(
        self,
        database: Database,
        clock: Callable[[], datetime] = utcnow,
        *,
        cache_s: float = STANDING_CACHE_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._database = database
        self._clock = clock
        self._cache_s = cache_s
        self._monotonic = monotonic
        self._copies: dict[str, tuple[float, list[GrantRow], Decimal]] = {}
        self._paying: set[asyncio.Task[int]] = set()

    async def standing(self, tenant_id: str) -> CreditStanding:
        now = self._monotonic()
        copy = self._copies.get(tenant_id)
        if copy is None or copy[0] <= now:
            async with self._database.session() as session:
                rows = await repository.grants_with_use(session, tenant_id)
                unpaid = await repository.unpaid_total(session, tenant_id)
            copy = (now + self._cache_s, rows, unpaid)
            self._copies[tenant_id] = copy
        return standing_of(copy[1], copy[2], self._clock())

    def forget(self, tenant_id: str) -> None:
        self._copies.pop(tenant_id, None)

    async def apply(self, tenant_id: str, request_ids: Sequence[str] | None = None) -> int:
        return await pay_pending(self._database, tenant_id, self._clock(), request_ids)

    async def after_record(self, ctx: RequestContext[Any]) -> None:
        """Called once a request's ledger entry is written: a prepaid tenant's entry is
        paid from its grants now (a failure here is repaired by the next balance read)."""
        plan = ctx.plan
        if plan is None or not plan.prepaid:
            return
        # In the background: the response does not wait for the payment, which nothing
        # in it shows (admission already counted the spend in the quota store).
        task = asyncio.create_task(self._pay(ctx.tenant_id, ctx.request_id))
        self._paying.add(task)
        task.add_done_callback(self._paying.discard)

    async def _pay(self, tenant_id: str, request_id: str) -> int:
        try:
            return await self.apply(tenant_id, [request_id])
        except Exception:
            log.warning(
                "credits could not be applied now; the next balance read applies them",
                extra={"tenant_id": tenant_id, "request_id": request_id},
                exc_info=True,
            )
            return 0

    async def drain(self) -> None:
        """Wait for the payments under way (tests, and a clean shutdown)."""
        while self._paying:
            await asyncio.gather(*list(self._paying), return_exceptions=True)
