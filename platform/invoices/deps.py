"""How the invoice service is made: one place for the account API, the admin API, the web
pages and the console."""

from __future__ import annotations

from litestar.di import NamedDependency
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.session import Database
from hydrant.platform.invoices.service import InvoiceService
from hydrant.settings import Settings


async def provide_invoice_service(
    db_session: NamedDependency[AsyncSession],
    database: NamedDependency[Database],
    settings: NamedDependency[Settings],
) -> InvoiceService:
    return InvoiceService(db_session, database, settings)
