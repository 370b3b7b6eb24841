"""`/admin/reports/reconciliation` and the job that stores a day: admins only, a bad day or
format is a 400, the figures of a known day balance to the cent (JSON and CSV), and the
job's rows (written twice: idempotent) are what the report then reads."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

from control_plane_helpers import ControlPlane, bearer
from reconciliation_factories import DAY, PATH, check_day, seed
from sqlalchemy import func, select

from hydrant.platform.db.models import PoolReconciliation, ReconciliationLine
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.reconciliation.tasks import reconcile_days
from hydrant.platform.services import services_of


async def test_admins_read_a_balanced_day_live_then_as_the_job_stored_it(cp: ControlPlane) -> None:
    tenants = await seed(cp)
    _, secret = await cp.tenant_with_key("c")
    assert (await cp.client.get(PATH)).status_code == 401
    assert (await cp.client.get(PATH, headers=bearer(secret))).status_code in (401, 403)
    bad = await cp.client.get(PATH, params={"day": "2026-13-01"}, headers=cp.admin)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "day"
    fmt = await cp.client.get(PATH, params={"format": "xml"}, headers=cp.admin)
    assert fmt.status_code == 400 and fmt.json()["error"]["param"] == "format"

    live = await cp.client.get(PATH, params={"day": "2026-12-01"}, headers=cp.admin)
    assert live.status_code == 200, live.text
    assert live.json()["source"] == "live"
    check_day(live.json(), tenants)
    other = await cp.client.get(PATH, params={"day": "2026-11-30"}, headers=cp.admin)
    assert other.json()["pools"] == []

    text = await cp.client.get(
        PATH, params={"day": "2026-12-01", "format": "csv"}, headers=cp.admin
    )
    assert text.headers["content-type"].startswith("text/csv")
    assert "hydrant-reconciliation-20261201.csv" in text.headers["content-disposition"]
    table = list(csv.DictReader(io.StringIO(text.text)))
    assert [r["record"] for r in table] == ["pool", "tenant", "tenant"]
    assert (table[0]["held_cost"], table[0]["idle_cost"], table[0]["tenant_id"]) == (
        "1.01",
        "0.40",
        "",
    )
    assert sum(Decimal(r["idle_cost"]) for r in table[1:]) == Decimal(table[0]["idle_cost"])

    async def run_job() -> dict[str, Any]:
        services = services_of(cp.app)
        ctx = JobContext(
            cp.settings,
            services.database,
            mailer=None,  # type: ignore[arg-type]  # the job sends no mail
            enqueue=lambda *_: None,  # type: ignore[arg-type,return-value]
            clock=lambda: DAY + timedelta(days=1, hours=1),
        )
        first = await reconcile_days(ctx)
        return {"first": first, "second": await reconcile_days(ctx)}

    runs = await cp.in_app(run_job)
    assert runs["first"] == runs["second"]
    assert runs["first"]["2026-12-01"] == {"pools": 1, "balanced": True}
    assert await cp.execute(select(func.count()).select_from(PoolReconciliation)) == 1
    assert await cp.execute(select(func.count()).select_from(ReconciliationLine)) == 2

    stored = await cp.client.get(PATH, params={"day": "2026-12-01"}, headers=cp.admin)
    assert stored.json()["source"] == "stored"
    check_day(stored.json(), tenants)
