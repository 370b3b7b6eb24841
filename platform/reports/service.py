"""Cost reports: the rows and their exact totals, for the admin API, `/v1/usage` and the CLI.

Totals are exact sums of the rows, which are exact sums of stored 6-place
charges, so a report's total equals the ledger's to the last micro-unit; only
the presentation rounds, once, to cents (`round_money(total, 2)`), never the
lines. Margin is charged minus device cost, per row and in total.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.session import Database
from hydrant.platform.errors import NotFound
from hydrant.platform.reports import repository
from hydrant.platform.reports.query import ReportQuery
from hydrant.platform.reports.repository import AggregateRow
from hydrant.platform.tenants.repository import find_tenant


@dataclass(frozen=True)
class ReportTotals:
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    charged: Decimal = Decimal(0)
    device_seconds: Decimal = Decimal(0)
    device_cost: Decimal = Decimal(0)
    batch_requests: int = 0  # of `requests`: Batch API lines
    batch_charged: Decimal = Decimal(0)  # of `charged`: at the batch price

    @property
    def margin(self) -> Decimal:
        return self.charged - self.device_cost

    @classmethod
    def of(cls, rows: Sequence[AggregateRow]) -> ReportTotals:
        return cls(
            requests=sum(r.requests for r in rows),
            input_tokens=sum(r.input_tokens for r in rows),
            cached_tokens=sum(r.cached_tokens for r in rows),
            output_tokens=sum(r.output_tokens for r in rows),
            charged=sum((r.charged for r in rows), Decimal(0)),
            device_seconds=sum((r.device_seconds for r in rows), Decimal(0)),
            device_cost=sum((r.device_cost for r in rows), Decimal(0)),
            batch_requests=sum(r.batch_requests for r in rows),
            batch_charged=sum((r.batch_charged for r in rows), Decimal(0)),
        )


@dataclass(frozen=True)
class CostReport:
    query: ReportQuery
    rows: Sequence[AggregateRow]
    totals: ReportTotals


class ReportService:
    """`estimated_models`: the models served by upstream pools, whose rows' device cost is
    marked as an estimate (taken from the configured pool kind, so a model that moved
    between kinds is marked by what serves it now)."""

    def __init__(
        self, session: AsyncSession, estimated_models: frozenset[str] = frozenset()
    ) -> None:
        self._session = session
        self._estimated = estimated_models

    async def costs(self, principal: Principal, query: ReportQuery) -> CostReport:
        """The report as `principal` may see it: a tenant only ever gets its own rows."""
        rows = [
            replace(r, device_cost_estimated=True) if r.model in self._estimated else r
            for r in await repository.aggregate(self._session, principal, query)
        ]
        return CostReport(query=query, rows=rows, totals=ReportTotals.of(rows))

    async def tenant_id_for(self, principal: Principal, ref: str) -> str:
        """A tenant's id from its id or name (what the console accepts); 404 when unknown."""
        tenant = await find_tenant(self._session, principal, ref)
        if tenant is None:
            raise NotFound(f"no tenant {ref!r}", param="tenant")
        return tenant.id


@asynccontextmanager
async def open_report_service(
    database_url: str, estimated_models: frozenset[str] = frozenset()
) -> AsyncIterator[ReportService]:
    """The same service outside a request (the CLI, jobs): its own pool, one unit of work."""
    database = Database(database_url)
    try:
        async with database.session() as session:
            yield ReportService(session, estimated_models)
    finally:
        await database.dispose()
