"""How the reconciliation service is made: one place for the admin API, the web page and
the job."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.reconciliation.service import ReconciliationService
from hydrant.settings import Settings


def reconciliation_service(
    session: AsyncSession, settings: Settings, clock: Callable[[], datetime] = utcnow
) -> ReconciliationService:
    return ReconciliationService(
        session,
        DevicePrice(settings.device_price_per_hour),
        clock,
        retention_days=settings.reconciliation_retention_days,
    )


async def provide_reconciliation_service(
    db_session: NamedDependency[AsyncSession], settings: NamedDependency[Settings]
) -> ReconciliationService:
    return reconciliation_service(db_session, settings)
