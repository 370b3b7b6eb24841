"""The cost report (admins: every tenant) and a tenant's usage (its own rows only).

Both go through the reports service and `build_query`, the parser of
`/admin/reports/costs` and `/v1/usage`; the CSV downloads are written by the
reports' own CSV functions, so the page, its CSV and the API agree to the
last micro-unit. A tenant's usage page goes through `TenantService.get`
first: another tenant's id is a 404, as on the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery

from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import DomainError
from hydrant.platform.prices.controllers import provide_price_service
from hydrant.platform.prices.service import PriceService
from hydrant.platform.reconciliation.deps import provide_reconciliation_service
from hydrant.platform.reconciliation.schemas import (
    ReconciliationView,
    reconciliation_csv,
)
from hydrant.platform.reconciliation.schemas import download_name as reconciliation_file
from hydrant.platform.reconciliation.service import ReconciliationService, parse_day
from hydrant.platform.reports.controllers import provide_report_service
from hydrant.platform.reports.csv_export import (
    CSV_MEDIA_TYPE,
    cost_report_csv,
    download_name,
    usage_csv,
)
from hydrant.platform.reports.query import ReportQuery, build_query
from hydrant.platform.reports.service import CostReport, ReportService
from hydrant.platform.tenants.controllers import provide_tenant_service
from hydrant.platform.tenants.service import TenantService
from hydrant.web.context import Page
from hydrant.web.report_view import build


@dataclass(frozen=True)
class Filters:
    since: str = ""
    until: str = ""
    tenant_id: str = ""
    model: str = ""
    group_by: str = "day"
    by: str = ""  # an attribution: `key`, `project`, `user` or `tag:<key>`

    def query(self, *, tenant_scoped: bool) -> ReportQuery:
        return build_query(
            now=utcnow(),
            since=self.since or None,
            until=self.until or None,
            group_by=self.group_by or "day",
            tenant_id=None if tenant_scoped else (self.tenant_id or None),
            model=self.model or None,
            by=self.by or None,
        )

    def as_params(self, **extra: str) -> dict[str, str]:
        values = {
            "since": self.since,
            "until": self.until,
            "tenant_id": self.tenant_id,
            "model": self.model,
            "group_by": self.group_by,
            "by": self.by,
            **extra,
        }
        return {k: v for k, v in values.items() if v}


def _csv(text: str, kind: str, report: CostReport) -> Response[str]:
    name = download_name(kind, report.query)
    return Response(
        text,
        media_type=CSV_MEDIA_TYPE,
        headers={
            "content-disposition": f'attachment; filename="{name}"',
            "cache-control": "no-store",
        },
    )


class ReportPagesController(Controller):
    path = "/"
    dependencies = {
        "reports": Provide(provide_report_service),
        "tenants": Provide(provide_tenant_service),
        "prices": Provide(provide_price_service),
        "reconciliation": Provide(provide_reconciliation_service),
    }

    @get("/reports/costs")
    async def costs(
        self,
        page: NamedDependency[Page],
        reports: NamedDependency[ReportService],
        tenants: NamedDependency[TenantService],
        prices: NamedDependency[PriceService],
        reconciliation: NamedDependency[ReconciliationService],
        since: FromQuery[str] = "",
        until: FromQuery[str] = "",
        tenant_id: FromQuery[str] = "",
        model: FromQuery[str] = "",
        group_by: FromQuery[str] = "day",
        day: FromQuery[str] = "",
        by: FromQuery[str] = "",
    ) -> Response[str]:
        principal = page.admin()
        filters = Filters(since, until, tenant_id, model, group_by, by)
        tenant_rows, _ = await tenants.list(principal, limit=200)
        model_rows, _ = await prices.list_deployments(limit=200)
        context: dict[str, Any] = {
            "filters": filters,
            "tenant_names": {t.id: t.name for t in tenant_rows},
            "model_names": sorted({m.name for m in model_rows}),
            "csv_params": filters.as_params(),
            "reconciliation": None,
        }
        try:
            # The day's reconciliation (UTC; today unless `day` names one) under the report.
            context["reconciliation"] = ReconciliationView.of(
                await reconciliation.report(parse_day(day or None, utcnow()))
            )
            report = await reports.costs(principal, filters.query(tenant_scoped=False))
        except DomainError as exc:
            return page.render(
                "costs.html", status=exc.status, error=exc.message, view=None, **context
            )
        view = build(report, show_device_cost=True)
        context["model_names"] = sorted({*context["model_names"], *(r.model for r in view.rows)})
        return page.render("costs.html", error=None, view=view, report=report, **context)

    @get("/reports/costs.csv")
    async def costs_csv(
        self,
        page: NamedDependency[Page],
        reports: NamedDependency[ReportService],
        since: FromQuery[str] = "",
        until: FromQuery[str] = "",
        tenant_id: FromQuery[str] = "",
        model: FromQuery[str] = "",
        group_by: FromQuery[str] = "day",
        by: FromQuery[str] = "",
    ) -> Response[str]:
        principal = page.admin()
        query = Filters(since, until, tenant_id, model, group_by, by).query(tenant_scoped=False)
        report = await reports.costs(principal, query)
        return page.respond(_csv(cost_report_csv(report), "costs", report))

    @get("/reports/reconciliation.csv")
    async def reconciliation_csv(
        self,
        page: NamedDependency[Page],
        reconciliation: NamedDependency[ReconciliationService],
        day: FromQuery[str] = "",
    ) -> Response[str]:
        page.admin()
        result = await reconciliation.report(parse_day(day or None, utcnow()))
        name = reconciliation_file(result.day)
        return page.respond(
            Response(
                reconciliation_csv(ReconciliationView.of(result)),
                media_type=CSV_MEDIA_TYPE,
                headers={
                    "content-disposition": f'attachment; filename="{name}"',
                    "cache-control": "no-store",
                },
            )
        )

    @get("/tenants/{tenant_id:str}/usage")
    async def usage(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        reports: NamedDependency[ReportService],
        tenants: NamedDependency[TenantService],
        since: FromQuery[str] = "",
        until: FromQuery[str] = "",
        model: FromQuery[str] = "",
        group_by: FromQuery[str] = "day",
        by: FromQuery[str] = "",
    ) -> Response[str]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)  # another tenant's id: 404
        filters = Filters(since, until, tenant.id, model, group_by, by)
        context: dict[str, Any] = {
            "tenant": tenant,
            "filters": filters,
            "csv_params": filters.as_params(tenant_id=""),
        }
        try:
            query = filters.query(tenant_scoped=not principal.is_admin)
            report = await reports.costs(principal, query)
        except DomainError as exc:
            return page.render(
                "usage.html", status=exc.status, error=exc.message, view=None, **context
            )
        view = build(report, show_device_cost=False)
        return page.render("usage.html", error=None, view=view, report=report, **context)

    @get("/tenants/{tenant_id:str}/usage.csv")
    async def usage_csv(
        self,
        tenant_id: FromPath[str],
        page: NamedDependency[Page],
        reports: NamedDependency[ReportService],
        tenants: NamedDependency[TenantService],
        since: FromQuery[str] = "",
        until: FromQuery[str] = "",
        model: FromQuery[str] = "",
        group_by: FromQuery[str] = "day",
        by: FromQuery[str] = "",
    ) -> Response[str]:
        principal = page.signed_in()
        tenant = await tenants.get(principal, tenant_id)
        filters = Filters(since, until, tenant.id, model, group_by, by)
        report = await reports.costs(principal, filters.query(tenant_scoped=not principal.is_admin))
        return page.respond(_csv(usage_csv(report), "usage", report))
