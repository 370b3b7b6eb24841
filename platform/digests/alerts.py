"""Budget alerts: mail a tenant's recipients when it reaches 80% and 100% of a budget.

Each alert goes once per (tenant, budget, period, threshold): the periodic
check claims it with a unique row and, after that row is committed, enqueues
the job that mails it (enqueue-after-commit). The mailing job moves the row
from `pending` to `sending` with a conditional UPDATE, so a job delivered
twice mails once; a failed send puts it back to `pending`, and the next
check re-enqueues pending alerts older than a minute (a lost enqueue is
retried, never dropped).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import BudgetAlertSend, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.digests.budgets import BudgetUse, budget_uses
from hydrant.platform.digests.render import build_message, render
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.mail.mailer import MailError
from hydrant.platform.reports.service import ReportService
from hydrant.platform.tenants.repository import plan_of

log = logging.getLogger(__name__)

THRESHOLDS = (80, 100)
SEND_JOB = "hydrant.budgets.send_alert"
RESEND_AFTER = timedelta(minutes=1)


class BudgetAlerts:
    def __init__(self, digests: DigestService, enqueue: Enqueue) -> None:
        self.digests = digests
        self.enqueue = enqueue

    @property
    def database(self) -> Database:
        return self.digests.database

    async def check(self, now: datetime | None = None) -> list[str]:
        """Claim every newly crossed threshold; returns the ids of the alerts claimed now."""
        moment = now or self.digests.clock()
        claimed: list[str] = []
        async with self.database.session() as session:
            reports = ReportService(session)
            for tenant in await repository.active_tenants(session):
                uses = await budget_uses(reports, tenant.id, await plan_of(session, tenant), moment)
                for use in uses:
                    for threshold in THRESHOLDS:
                        if use.percent < threshold:
                            continue
                        alert = BudgetAlertSend(
                            tenant_id=tenant.id,
                            budget=use.budget,
                            period=use.period,
                            threshold=threshold,
                            used=use.used,
                            limit=use.limit,
                            claimed_at=moment,
                        )
                        try:
                            async with session.begin_nested():
                                session.add(alert)
                        except IntegrityError:
                            continue  # sent (or claimed) earlier in this period
                        claimed.append(alert.id)
                        enqueue_after_commit(session, self.enqueue, SEND_JOB, alert_id=alert.id)
            stale = await session.scalars(
                select(BudgetAlertSend.id).where(
                    BudgetAlertSend.status == "pending",
                    BudgetAlertSend.claimed_at < moment - RESEND_AFTER,
                )
            )
            for alert_id in stale.all():
                enqueue_after_commit(session, self.enqueue, SEND_JOB, alert_id=alert_id)
        return claimed

    async def send(self, alert_id: str) -> bool:
        """Mail one claimed alert; False when another run has it or it was sent already."""
        async with self.database.session() as session:
            taken = await session.execute(
                update(BudgetAlertSend)
                .where(BudgetAlertSend.id == alert_id, BudgetAlertSend.status == "pending")
                .values(status="sending")
            )
            if taken.rowcount != 1:  # type: ignore[attr-defined]
                return False
            alert = await session.get(BudgetAlertSend, alert_id)
            assert alert is not None
            tenant = await session.get(Tenant, alert.tenant_id)
            assert tenant is not None
            recipients = await self.digests.recipients_for(session, tenant)
        use = BudgetUse(
            budget=alert.budget,
            unit="tokens" if alert.budget.startswith("tokens") else "spend",
            period=alert.period,
            used=Decimal(alert.used),
            limit=Decimal(alert.limit),
        )
        try:
            for recipient in recipients:
                url = self.digests.unsubscribe_url(tenant.id, recipient)
                rendered = render(
                    "budget_alert",
                    f"Hydrant: {tenant.name} reached {alert.threshold}% of {use.label.lower()}",
                    None,
                    tenant_name=tenant.name,
                    use=use,
                    threshold=alert.threshold,
                    unsubscribe_url=url,
                )
                await self.digests.mailer.send(
                    build_message(
                        rendered,
                        sender=self.digests.settings.digest_from,
                        recipient=recipient,
                        message_key=f"alert|{alert.id}",
                        unsubscribe_url=url,
                    )
                )
        except MailError:
            async with self.database.session() as session:
                await session.execute(
                    update(BudgetAlertSend)
                    .where(BudgetAlertSend.id == alert_id)
                    .values(status="pending")
                )
            raise
        async with self.database.session() as session:
            await session.execute(
                update(BudgetAlertSend)
                .where(BudgetAlertSend.id == alert_id)
                .values(status="sent", sent_at=utcnow())
            )
        log.info(
            "budget alert sent",
            extra={"tenant_id": tenant.id, "budget": alert.budget, "threshold": alert.threshold},
        )
        return True
