"""Route: `/admin/reports/reconciliation?day=YYYY-MM-DD[&format=csv]` (admin keys)."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromQuery, QueryParameter

from hydrant.platform.auth.dependencies import provide_admin_principal, require_admin
from hydrant.platform.db.base import utcnow
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.reconciliation.deps import provide_reconciliation_service
from hydrant.platform.reconciliation.schemas import (
    ReconciliationView,
    download_name,
    reconciliation_csv,
)
from hydrant.platform.reconciliation.service import ReconciliationService, parse_day
from hydrant.platform.reports.csv_export import CSV_MEDIA_TYPE

Format = Annotated[str, QueryParameter(name="format")]  # `format` is a builtin


class ReconciliationController(Controller):
    path = "/admin/reports"
    guards = [require_admin]
    dependencies = {
        "principal": Provide(provide_admin_principal),
        "reconciliation": Provide(provide_reconciliation_service),
    }

    @get("/reconciliation")
    async def reconciliation(
        self,
        reconciliation: NamedDependency[ReconciliationService],
        day: FromQuery[str | None] = None,
        output_format: Format = "json",
    ) -> Response[Any]:
        """A UTC day's device cost per pool, balanced against requests, idle, load, drain
        and sleep, with each tenant's revenue, direct cost, idle share and margin."""
        if output_format not in ("json", "csv"):
            raise InvalidRequest("format must be `json` or `csv`", param="format")
        result = await reconciliation.report(parse_day(day, utcnow()))
        view = ReconciliationView.of(result)
        if output_format == "csv":
            return Response(
                reconciliation_csv(view),
                media_type=CSV_MEDIA_TYPE,
                headers={
                    "content-disposition": f'attachment; filename="{download_name(result.day)}"'
                },
            )
        return Response(view)
