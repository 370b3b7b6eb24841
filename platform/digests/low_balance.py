"""Low-balance alerts: mail a prepaid tenant's recipients when its credit balance falls
under one of its thresholds, once per crossing (credits/low_balance.py decides crossings).

Why a periodic job and not the settlement itself: the balance also falls with no
settlement at all (a grant expires or is voided) and rises with a grant, and the mail
goes through the job queue in any case. The check pays the tenant's pending ledger
entries first (`pay_pending`, the same as a balance read), so the balance it compares
is exact; it costs one balance read per tenant that has thresholds, and runs every
minute. The mail path, recipients and unsubscribe rules are the budget alerts'
(alerts.py): claimed row -> enqueue after commit -> `pending` -> `sending` -> `sent`.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import select, update

from hydrant.platform.credits import repository as credit_rows
from hydrant.platform.credits.low_balance import (
    lock_thresholds,
    mark_crossings,
    tenants_with_thresholds,
)
from hydrant.platform.credits.service import pay_pending, standing_of
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.credit_models import CreditAlertSend
from hydrant.platform.db.models import Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests.render import build_message, render
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.mail.mailer import MailError

log = logging.getLogger(__name__)

SEND_JOB = "hydrant.credits.send_low_balance"
RESEND_AFTER = timedelta(minutes=1)


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
            stale = await session.scalars(
                select(CreditAlertSend.id).where(
                    CreditAlertSend.status == "pending",
                    CreditAlertSend.claimed_at < moment - RESEND_AFTER,
                )
            )
            for alert_id in stale.all():
                enqueue_after_commit(session, self.enqueue, SEND_JOB, alert_id=alert_id)
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
        async with self.database.session() as session:
            taken = await session.execute(
                update(CreditAlertSend)
                .where(CreditAlertSend.id == alert_id, CreditAlertSend.status == "pending")
                .values(status="sending")
            )
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                return False
            alert = await session.get(CreditAlertSend, alert_id)
            assert alert is not None
            tenant = await session.get(Tenant, alert.tenant_id)
            assert tenant is not None
            recipients = await self.digests.recipients_for(session, tenant)
        try:
            for recipient in recipients:
                url = self.digests.unsubscribe_url(tenant.id, recipient)
                rendered = render(
                    "low_balance",
                    f"Hydrant: {tenant.name}'s credit balance is under "
                    f"{alert.amount.normalize():f} {alert.currency}",
                    None,
                    tenant_name=tenant.name,
                    balance=alert.balance,
                    threshold=alert.amount,
                    currency=alert.currency,
                    unsubscribe_url=url,
                )
                await self.digests.mailer.send(
                    build_message(
                        rendered,
                        sender=self.digests.settings.digest_from,
                        recipient=recipient,
                        message_key=f"low-balance|{alert.id}",
                        unsubscribe_url=url,
                    )
                )
        except MailError:
            async with self.database.session() as session:
                await session.execute(
                    update(CreditAlertSend)
                    .where(CreditAlertSend.id == alert_id)
                    .values(status="pending")
                )
            raise
        async with self.database.session() as session:
            await session.execute(
                update(CreditAlertSend)
                .where(CreditAlertSend.id == alert_id)
                .values(status="sent", sent_at=utcnow())
            )
        log.info(
            "low-balance alert sent",
            extra={"tenant_id": tenant.id, "crossing": alert.crossing},
        )
        return True
