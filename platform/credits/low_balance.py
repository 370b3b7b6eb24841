"""Low-balance thresholds: which a balance has crossed, each claimed once per crossing.

A threshold is an absolute amount in the tenant's credits' currency (not a percentage of
what was granted: grants come and go, and "warn me under $50" is what a person means).
The balance falling under it flips `below` with a conditional UPDATE and claims a
`CreditAlertSend` keyed by (threshold, crossing number): two checkers racing on either
database flip it once (the loser's UPDATE matches no row), and the unique key backs that
up. The balance back at or above the amount (a grant) re-arms the threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.credit_models import CreditAlertSend, CreditAlertThreshold

MAX_THRESHOLDS = 10


async def thresholds_of(session: AsyncSession, tenant_id: str) -> list[CreditAlertThreshold]:
    statement = (
        select(CreditAlertThreshold)
        .where(CreditAlertThreshold.tenant_id == tenant_id)
        .order_by(CreditAlertThreshold.amount.desc())
    )
    return list((await session.scalars(statement)).all())


async def tenants_with_thresholds(session: AsyncSession) -> list[str]:
    statement = select(CreditAlertThreshold.tenant_id).distinct()
    return sorted((await session.scalars(statement)).all())


async def replace_thresholds(
    session: AsyncSession, tenant_id: str, amounts: Sequence[Decimal]
) -> list[CreditAlertThreshold]:
    """Set the tenant's thresholds to `amounts`; one kept keeps its crossing state (a
    re-sent setting does not re-mail a crossing already mailed)."""
    wanted = set(amounts)
    existing = await thresholds_of(session, tenant_id)
    gone = [t.id for t in existing if t.amount not in wanted]
    if gone:
        await session.execute(delete(CreditAlertThreshold).where(CreditAlertThreshold.id.in_(gone)))
    kept = {t.amount for t in existing if t.amount in wanted}
    session.add_all(
        CreditAlertThreshold(tenant_id=tenant_id, amount=a) for a in sorted(wanted - kept)
    )
    await session.flush()
    session.expire_all()
    return await thresholds_of(session, tenant_id)


async def lock_thresholds(session: AsyncSession, tenant_id: str) -> None:
    """Make this unit of work the tenant's only checker until it commits: a no-op UPDATE of
    its thresholds takes their row locks (PostgreSQL) or the write lock (SQLite), so a
    check that read an older balance cannot re-arm a threshold after a newer check
    flipped it (which would mail the same crossing twice). Read the balance after this."""
    await session.execute(
        update(CreditAlertThreshold)
        .where(CreditAlertThreshold.tenant_id == tenant_id)
        .values(crossings=CreditAlertThreshold.crossings)
    )


async def mark_crossings(
    session: AsyncSession, tenant_id: str, balance: Decimal, currency: str, now: datetime
) -> list[str]:
    """Claim a mail for each threshold the balance is newly under, re-arm each it is at or
    above again; the ids of the mails claimed now (to send once this commits)."""
    claimed: list[str] = []
    for threshold in await thresholds_of(session, tenant_id):
        if balance >= threshold.amount:
            if threshold.below:
                await session.execute(
                    update(CreditAlertThreshold)
                    .where(CreditAlertThreshold.id == threshold.id)
                    .values(below=False)
                )
            continue
        flipped = await session.execute(
            update(CreditAlertThreshold)
            .where(
                CreditAlertThreshold.id == threshold.id,
                CreditAlertThreshold.below.is_(False),
            )
            .values(below=True, crossings=CreditAlertThreshold.crossings + 1)
        )
        if flipped.rowcount != 1:  # type: ignore[attr-defined]
            continue  # already below: mailed for this crossing (or another checker has it)
        crossing = await session.scalar(
            select(CreditAlertThreshold.crossings).where(CreditAlertThreshold.id == threshold.id)
        )
        send = CreditAlertSend(
            tenant_id=tenant_id,
            threshold_id=threshold.id,
            crossing=int(crossing or 0),
            amount=threshold.amount,
            balance=balance,
            currency=currency,
            claimed_at=now,
        )
        try:
            async with session.begin_nested():
                session.add(send)
        except IntegrityError:
            continue
        claimed.append(send.id)
    return claimed
