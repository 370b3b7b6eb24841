"""Budget alerts: mail a tenant's recipients when it reaches 80% and 100% of a budget.

The budgets are the tenant's plan's and each project's and API key's own (the
strictest refuses first, so each is worth a warning). Each alert goes once per
(tenant, owner, budget, period, threshold), the owner being the tenant, project or
key: the periodic check claims it with a unique row and, after that row is committed,
enqueues the job that mails it (enqueue-after-commit); the mail path from there
(`pending` -> `sending` -> `sent`, retried, never dropped), the recipients and the
unsubscribe rules are alert_mail.py's, the same for every owner.
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from sqlalchemy.exc import IntegrityError

from hydrant.platform.db.models import ApiKey, BudgetAlertSend, Project
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.digests.alert_mail import deliver, requeue_stale, take
from hydrant.platform.digests.budgets import (
    SCOPES,
    BudgetOwner,
    BudgetUse,
    Scope,
    budget_uses,
    owner_budget_uses,
)
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
            projects = await repository.budgeted_projects(session)
            keys = await repository.budgeted_keys(session)
            for tenant in await repository.active_tenants(session):
                uses = await budget_uses(reports, tenant.id, await plan_of(session, tenant), moment)
                for owners in (
                    [BudgetOwner.of_project(p) for p in projects.get(tenant.id, [])],
                    [BudgetOwner.of_key(k) for k in keys.get(tenant.id, [])],
                ):
                    uses += await owner_budget_uses(reports, tenant.id, owners, moment)
                for use in uses:
                    for threshold in THRESHOLDS:
                        if use.percent < threshold:
                            continue
                        alert = BudgetAlertSend(
                            tenant_id=tenant.id,
                            scope=use.scope,
                            owner=use.owner_id,
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
            scope=scope_of(alert.scope),
            owner_id=alert.owner,
            owner_name=await self._owner_name(alert),
        )
        subject = f"Hydrant: {tenant.name} reached {alert.threshold}% of {use.label.lower()}"
        if use.owner:
            subject = (
                f"Hydrant: {tenant.name}'s {use.owner} reached {alert.threshold}% of its"
                f" {use.label.lower()}"
            )
        await deliver(
            self.digests,
            BudgetAlertSend,
            alert_id,
            tenant,
            recipients,
            template="budget_alert",
            subject=subject,
            message_key=f"alert|{alert.id}",
            use=use,
            threshold=alert.threshold,
        )
        log.info(
            "budget alert sent",
            extra={
                "tenant_id": tenant.id,
                "scope": alert.scope,
                "owner": alert.owner,
                "budget": alert.budget,
                "threshold": alert.threshold,
            },
        )
        return True

    async def _owner_name(self, alert: BudgetAlertSend) -> str:
        """The project's or key's name as it is now (renamed since the claim: the new name);
        "" for the tenant's own budgets."""
        if alert.scope == "tenant":
            return ""
        async with self.database.session() as session:
            if alert.scope == "project":
                project = await session.get(Project, alert.owner)
                return BudgetOwner.of_project(project).name if project else alert.owner
            key = await session.get(ApiKey, alert.owner)
            return BudgetOwner.of_key(key).name if key is not None else alert.owner


def scope_of(value: str) -> Scope:
    """A stored scope as the type says it is (the table's CHECK allows no other)."""
    for scope in SCOPES:
        if value == scope:
            return scope
    raise ValueError(f"unknown budget scope {value!r}")
