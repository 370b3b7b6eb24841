"""The periodic payer: every tenant's unpaid ledger entries paid from its grants.

Why a job and not only the payment after each request: an entry the gateway could not
write at once (spooled while the database was away, replayed from the journal) reaches
the ledger after its request's own payment ran and found nothing, and a post-paid
tenant's entries are not paid after their request at all. Until paid, such an entry is
in no one's balance: the database's spend that admission raises the quota store's
counter to (`quotas/credit_check.py`) leaves it out, `GET /account/balance` would pay
it only when someone reads. So this job pays them within a minute of their arrival,
whoever reads or not. The payment itself is `pay_pending`, the one every balance read,
low-balance check and invoice uses: keyed by request id, so racing payers on other
gateways or workers pay an entry once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from hydrant.platform.credits import repository
from hydrant.platform.credits.service import pay_pending
from hydrant.platform.db.session import Database

log = logging.getLogger(__name__)


@dataclass
class PayReport:
    tenants: int = 0  # tenants that had pending entries
    entries: int = 0  # entries paid now (others' payers may have paid some first)
    failed: list[str] = field(default_factory=list)  # tenant ids, retried by the next run


async def pay_all_pending(database: Database, now: datetime) -> PayReport:
    """Pay the pending entries of every tenant that has any; one tenant's failure is
    logged and left to the next run, never stopping the others' payments."""
    async with database.session() as session:
        tenant_ids = await repository.tenants_with_pending(session)
    report = PayReport(tenants=len(tenant_ids))
    for tenant_id in tenant_ids:
        try:
            report.entries += await pay_pending(database, tenant_id, now)
        except Exception:
            report.failed.append(tenant_id)
            log.warning(
                "pending ledger entries could not be paid from credits; the next run retries",
                extra={"tenant_id": tenant_id},
                exc_info=True,
            )
    if report.entries:
        log.info(
            "pending ledger entries paid from credits",
            extra={"tenants": report.tenants, "entries": report.entries},
        )
    return report
