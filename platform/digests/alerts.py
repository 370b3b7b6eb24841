"""Budget alerts: mail a tenant's recipients when it reaches 80% and 100% of a budget.

Each alert goes once per (tenant, budget, period, threshold): the periodic
check claims it with a unique row and, after that row is committed, enqueues
the job that mails it (enqueue-after-commit); the mail path from there
(`pending` -> `sending` -> `sent`, retried, never dropped) is alert_mail.py's.
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from sqlalchemy.exc import IntegrityError

from hydrant.platform.db.models import BudgetAlertSend
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.digests.alert_mail import deliver, requeue_stale, take
from hydrant.platform.digests.budgets import BudgetUse, budget_uses
from hydrant.platform.digests.service import DigestService
from hydrant.platform.jobs.after_commit import Enqueue, enqueue_after_commit
from hydrant.platform.reports.service import ReportService
from hydrant.platform.tenants.repository import plan_of

log = logging.getLogger(__name__)

THRESHOLDS = (80, 100)
SEND_JOB = "hydrant.budgets.send_alert"


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
            await requeue_stale(session, BudgetAlertSend, self.enqueue, SEND_JOB, moment)
        return claimed

    async def send(self, alert_id: str) -> bool:
        """Mail one claimed alert; False when another run has it or it was sent already."""
        taken = await take(self.digests, BudgetAlertSend, alert_id)
        if taken is None:
            return False
        alert, tenant, recipients = taken
        use = BudgetUse(
            budget=alert.budget,
            unit="tokens" if alert.budget.startswith("tokens") else "spend",
            period=alert.period,
            used=Decimal(alert.used),
            limit=Decimal(alert.limit),
        )
        await deliver(
            self.digests,
            BudgetAlertSend,
            alert_id,
            tenant,
            recipients,
            template="budget_alert",
            subject=f"Hydrant: {tenant.name} reached {alert.threshold}% of {use.label.lower()}",
            message_key=f"alert|{alert.id}",
            use=use,
            threshold=alert.threshold,
        )
        log.info(
            "budget alert sent",
            extra={"tenant_id": tenant.id, "budget": alert.budget, "threshold": alert.threshold},
        )
        return True
