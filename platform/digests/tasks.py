"""Thin job wrappers around the digest, budget-alert and low-balance-alert services
(Celery or embedded)."""

from __future__ import annotations

import logging
from datetime import date
from typing import Any

from hydrant.platform.digests.deps import budget_alerts, digest_service, low_balance_alerts
from hydrant.platform.jobs.context import Job, JobContext

log = logging.getLogger(__name__)

DISPATCH = "hydrant.digests.dispatch"
SEND_TENANT = "hydrant.digests.send_tenant"
SEND_ADMIN = "hydrant.digests.send_admin"
CHECK_BUDGETS = "hydrant.budgets.check"
SEND_ALERT = "hydrant.budgets.send_alert"
CHECK_LOW_BALANCE = "hydrant.credits.check_low_balance"
SEND_LOW_BALANCE = "hydrant.credits.send_low_balance"


async def dispatch_digests(ctx: JobContext) -> dict[str, Any]:
    """Enqueue each digest whose hour has come; the send itself is claimed, so repeats are safe."""
    digests = digest_service(ctx)
    due = await digests.due_digests()
    for tenant_id, day in due:
        ctx.enqueue(SEND_TENANT, {"tenant_id": tenant_id, "day": day.isoformat()})
    admin_day = await digests.admin_digest_due()
    if admin_day is not None:
        ctx.enqueue(SEND_ADMIN, {"day": admin_day.isoformat()})
    stuck = await digests.stuck_sends()
    if stuck:  # never re-sent on their own: a person checks and uses .../resend
        log.warning(
            "digest sends stuck in `sending` (GET /admin/digests/stuck)",
            extra={"sends": [s.id for s in stuck]},
        )
    return {
        "tenant_digests": len(due),
        "admin_digest": admin_day is not None,
        "stuck_sends": len(stuck),
    }


async def send_tenant_digest(ctx: JobContext, tenant_id: str, day: str) -> dict[str, Any]:
    result = await digest_service(ctx).send_tenant_digest(tenant_id, date.fromisoformat(day))
    return {"outcome": result.outcome, "recipients": result.recipients}


async def send_admin_digest(ctx: JobContext, day: str) -> dict[str, Any]:
    result = await digest_service(ctx).send_admin_digest(date.fromisoformat(day))
    return {"outcome": result.outcome, "recipients": result.recipients}


async def check_budgets(ctx: JobContext) -> dict[str, Any]:
    return {"claimed": len(await budget_alerts(ctx).check())}


async def send_budget_alert(ctx: JobContext, alert_id: str) -> dict[str, Any]:
    return {"sent": await budget_alerts(ctx).send(alert_id)}


async def check_low_balance(ctx: JobContext) -> dict[str, Any]:
    return {"claimed": len(await low_balance_alerts(ctx).check())}


async def send_low_balance(ctx: JobContext, alert_id: str) -> dict[str, Any]:
    return {"sent": await low_balance_alerts(ctx).send(alert_id)}


TASKS = (
    Job(DISPATCH, dispatch_digests),
    Job(SEND_TENANT, send_tenant_digest),
    Job(SEND_ADMIN, send_admin_digest),
    Job(CHECK_BUDGETS, check_budgets),
    Job(SEND_ALERT, send_budget_alert),
    Job(CHECK_LOW_BALANCE, check_low_balance),
    Job(SEND_LOW_BALANCE, send_low_balance),
)
