"""The daily hosting fee of tenants' adapters: one ledger entry per adapter per UTC day.

Why entries in the ledger and not a separate bill: the ledger is the one source of money
(reports, budgets' alerts, invoices, prepaid credits read it), so a fee is an entry like a
request's, with no tokens. Its request id is the idempotency key (`hosting-<adapter>-<day>`,
inserted if absent), so however often the job runs, on however many workers, a day is
charged once. The rule: a day's fee is due for every adapter registered (with a fee and a
tenant) when the job runs during that day; it runs hourly, so a day is not missed while
the job runs at all, and a day it did not run is not charged afterwards.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from hydrant.platform.db.adapter_models import Adapter
from hydrant.platform.db.models import ModelDeployment
from hydrant.platform.db.session import Database
from hydrant.platform.ledger import repository as ledger

log = logging.getLogger(__name__)


def fee_request_id(adapter_id: str, moment: datetime) -> str:
    return f"hosting-{adapter_id}-{moment.astimezone(UTC):%Y%m%d}"


async def charge_hosting_fees(database: Database, now: datetime) -> int:
    """Write today's fee entries that are not written yet; how many were new."""
    day_start = datetime.combine(now.astimezone(UTC).date(), time(0), tzinfo=UTC)
    async with database.session() as session:
        rows = (
            await session.execute(
                select(Adapter, ModelDeployment.id)
                .join(ModelDeployment, ModelDeployment.name == Adapter.base_model)
                .where(Adapter.hosting_fee_per_day.is_not(None), Adapter.tenant_id.is_not(None))
            )
        ).all()
        entries: list[dict[str, Any]] = [
            {
                "request_id": fee_request_id(adapter.id, now),
                "tenant_id": adapter.tenant_id,
                "api_key_id": None,
                "model_id": model_id,
                "price_id": None,
                "status": "finished",
                "input_tokens": 0,
                "cached_tokens": 0,
                "output_tokens": 0,
                "charged": adapter.hosting_fee_per_day,
                "device_seconds": Decimal(0),
                "device_cost": Decimal(0),
                "started_at": day_start,
                "finished_at": day_start,
                "batch_id": None,
                "adapter": adapter.name,
                "recorded_at": now,
            }
            for adapter, model_id in rows
        ]
        written = await ledger.insert_if_absent(session, entries)
    if written:
        log.info("adapter hosting fees charged", extra={"entries": written})
    return written
