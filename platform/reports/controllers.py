"""Routes: `/admin/reports/costs` (admin keys, every tenant) and `/v1/usage` (a tenant's own).

Both read the same service through the same query parser; the tenant route
passes no tenant filter at all: the principal's scope (`scope_to`) is what
keeps it to the caller's rows.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromQuery, QueryParameter
from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.dependencies import (
    provide_admin_principal,
    require_admin,
    require_inference,
)
from hydrant.platform.auth.principal import Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.reports.csv_export import (
    CSV_MEDIA_TYPE,
    cost_report_csv,
    download_name,
    usage_csv,
)
from hydrant.platform.reports.query import build_query
from hydrant.platform.reports.schemas import CostReportView, UsageView
from hydrant.platform.reports.service import CostReport, ReportService
from hydrant.settings import Settings

FORMATS = ("json", "csv")
Format = Annotated[str, QueryParameter(name="format")]  # `format` is a builtin


async def provide_report_service(
    db_session: NamedDependency[AsyncSession], settings: NamedDependency[Settings]
) -> ReportService:
    return ReportService(db_session, frozenset(settings.upstream_pools()))


def _check_format(output_format: str) -> str:
    if output_format not in FORMATS:
        raise InvalidRequest("format must be `json` or `csv`", param="format")
    return output_format


def _csv_response(text: str, kind: str, report: CostReport) -> Response[str]:
    name = download_name(kind, report.query)
    return Response(
        text,
        media_type=CSV_MEDIA_TYPE,
        headers={"content-disposition": f'attachment; filename="{name}"'},
    )


class CostReportController(Controller):
    path = "/admin/reports"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "reports": Provide(provide_report_service),
    }

    @get("/costs")
    async def costs(
        self,
        principal: NamedDependency[Principal],
        reports: NamedDependency[ReportService],
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        tenant_id: FromQuery[str | None] = None,
        model: FromQuery[str | None] = None,
        group_by: FromQuery[str] = "day",
        by: FromQuery[str | None] = None,
        output_format: Format = "json",
    ) -> Response[Any]:
        """Charged, device cost and margin per (day or hour, tenant, model), with totals;
        `by` (`key`, `project`, `user`, `tag:<key>`) splits each row by that attribution."""
        fmt = _check_format(output_format)
        query = build_query(
            now=utcnow(),
            since=since,
            until=until,
            group_by=group_by,
            tenant_id=tenant_id,
            model=model,
            by=by,
        )
        report = await reports.costs(principal, query)
        if fmt == "csv":
            return _csv_response(cost_report_csv(report), "costs", report)
        return Response(CostReportView.of(report))


class UsageController(Controller):
    path = "/v1/usage"
    guards = [require_inference]
    # `principal` is the app-wide provider (the inference principal, app.py).
    dependencies = {"reports": Provide(provide_report_service)}

    @get("/")
    async def usage(
        self,
        principal: NamedDependency[Principal],
        reports: NamedDependency[ReportService],
        since: FromQuery[str | None] = None,
        until: FromQuery[str | None] = None,
        model: FromQuery[str | None] = None,
        group_by: FromQuery[str] = "day",
        by: FromQuery[str | None] = None,
        output_format: Format = "json",
    ) -> Response[Any]:
        """The caller's own tokens and charges per (day or hour, model), with totals; `by`
        splits rows by key, project, hashed end user or one tag (`tag:<key>`)."""
        fmt = _check_format(output_format)
        query = build_query(
            now=utcnow(), since=since, until=until, group_by=group_by, model=model, by=by
        )
        report = await reports.costs(principal, query)
        if fmt == "csv":
            return _csv_response(usage_csv(report), "usage", report)
        return Response(UsageView.of(report))
