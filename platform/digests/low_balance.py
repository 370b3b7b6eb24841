"""Low-balance alerts: mail a prepaid tenant's recipients when its credit balance falls
under one of its thresholds, once per crossing (credits/low_balance.py decides crossings).

Why a periodic job and not the settlement itself: the balance also falls with no
settlement at all (a grant expires or is voided) and rises with a grant, and the mail
goes through the job queue in any case. The check pays the tenant's pending ledger
entries first (`pay_pending`, the same as a balance read), so the balance it compares
is exact; it costs one balance read per tenant that has thresholds, and runs every
minute. The mail path, recipients and unsubscribe rules are the budget alerts'
(alert_mail.py): claimed row -> enqueue after commit -> `pending` -> `sending` -> `sent`.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import select

from hydrant.platform.credits import repository as credit_rows
from hydrant.platform.credits.low_balance import (
    lock_thresholds,
    mark_crossings,
    tenants_with_thresholds,
)
from hydrant.platform.credits.service import pay_pending, standing_of
from hydrant.platform.db.credit_models import CreditAlertSend
from hydrant.platform.db.models import Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests.alert_mail import deliver, requeue_stale, take
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit

log = logging.getLogger(__name__)

SEND_JOB = "hydrant.credits.send_low_balance"


class LowBalanceAlerts:
    def __init__(self, digests: DigestService, enqueue: Enqueue) -> None:
        self.digests = digests
        self.enqueue = enqueue

    @property
    def database(self) -> Database:
        return self.digests.database

    async def check(self, now: datetime | None = None) -> list[str]:
        """Claim a mail for every threshold newly crossed; the ids claimed now."""
        moment = now or self.digests.clock()
        async with self.database.session() as session:
            tenant_ids = await tenants_with_thresholds(session)
            active = set(
                await session.scalars(
                    select(Tenant.id).where(Tenant.id.in_(tenant_ids), Tenant.status == "active")
                )
            )
        claimed: list[str] = []
        for tenant_id in sorted(active):
            try:
                claimed += await self.check_tenant(tenant_id, moment)
            except Exception:  # one tenant's failure must not silence the others' alerts
                log.warning(
                    "low-balance check failed; the next check retries it",
                    extra={"tenant_id": tenant_id},
                    exc_info=True,
                )
        async with self.database.session() as session:
            await requeue_stale(session, CreditAlertSend, self.enqueue, SEND_JOB, moment)
        return claimed

    async def check_tenant(self, tenant_id: str, now: datetime) -> list[str]:
        await pay_pending(self.database, tenant_id, now)
        async with self.database.session() as session:
            await lock_thresholds(session, tenant_id)
            rows = await credit_rows.grants_with_use(session, tenant_id)
            if not rows:
                return []  # no credits at all: not a prepaid balance to warn about
            standing = standing_of(rows, await credit_rows.unpaid_total(session, tenant_id), now)
            claimed = await mark_crossings(
                session, tenant_id, standing.balance, standing.currency, now
            )
            for alert_id in claimed:
                enqueue_after_commit(session, self.enqueue, SEND_JOB, alert_id=alert_id)
        return claimed

    async def send(self, alert_id: str) -> bool:
        """Mail one claimed alert; False when another run has it or it was sent already."""
        taken = await take(self.digests, CreditAlertSend, alert_id)
        if taken is None:
            return False
        alert, tenant, recipients = taken
        await deliver(
            self.digests,
            CreditAlertSend,
            alert_id,
            tenant,
            recipients,
            template="low_balance",
            subject=f"Hydrant: {tenant.name}'s credit balance is under "
            f"{alert.amount.normalize():f} {alert.currency}",
            message_key=f"low-balance|{alert.id}",
            balance=alert.balance,
            threshold=alert.amount,
            currency=alert.currency,
        )
        log.info(
            "low-balance alert sent",
            extra={"tenant_id": tenant.id, "crossing": alert.crossing},
        )
        return True
