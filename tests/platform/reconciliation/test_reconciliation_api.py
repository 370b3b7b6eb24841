"""`/admin/reports/reconciliation` and the job that stores a day: admins only, a bad day or
format is a 400, the figures of a known day balance to the cent (JSON and CSV), and the
job's rows (written twice: idempotent) are what the report then reads."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from control_plane_helpers import ControlPlane, bearer
from report_factories import add_models, add_tenants, insert_rows, row
from sqlalchemy import func, select

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.db.models import PoolReconciliation, ReconciliationLine
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.reconciliation.recorder import TimelineRecorder
from hydrant.platform.reconciliation.tasks import reconcile_days
from hydrant.platform.services import services_of

DAY = datetime(2026, 12, 1, tzinfo=UTC)
START = DAY + timedelta(hours=10)
PATH = "/admin/reports/reconciliation"


def worker(state: str, since: timedelta, beat: timedelta) -> WorkerRecord:
    return WorkerRecord(
        worker_id="w1",
        model="tiny",
        address="http://127.0.0.1:1",
        device="cpu",
        state=state,  # type: ignore[arg-type]
        path="/models/tiny",
        started_at=START.timestamp(),
        state_since=(START + since).timestamp(),
        heartbeat_at=(START + beat).timestamp(),
    )


async def seed(cp: ControlPlane) -> dict[str, str]:
    """36 s loading and an hour ready at $1.00/h (held $1.01, load $0.01); requests of
    tenant a ($0.40 of device time, 1 s busy) and b ($0.20, 0.5 s busy)."""

    async def run() -> dict[str, str]:
        database = services_of(cp.app).database
        async with database.session() as session:
            tenants = await add_tenants(session, ["a", "b"])
            models = await add_models(session, ["tiny"])
            at = START + timedelta(minutes=5)
            rows = [
                row(tenants["a"], "tiny", at, "1.50", request_id="r1", device_cost="0.30"),
                row(tenants["a"], "tiny", at, "0.50", request_id="r2", device_cost="0.10"),
                row(tenants["b"], "tiny", at, "0.90", request_id="r3", device_cost="0.20"),
            ]
            await insert_rows(session, rows, models)
        recorder = TimelineRecorder(database)
        await recorder.record([worker("starting", timedelta(0), timedelta(seconds=10))])
        ready = timedelta(seconds=36)
        await recorder.record([worker("ready", ready, ready + timedelta(minutes=30))])
        await recorder.record([worker("ready", ready, ready + timedelta(hours=1))])
        return tenants

    return await cp.in_app(run)


def check_day(body: dict[str, Any], tenants: dict[str, str]) -> None:
    (pool,) = body["pools"]
    assert pool["model"] == "tiny" and pool["held_seconds"] == "3636.000000"
    assert (pool["held_cost"], pool["load_cost"], pool["request_cost"]) == ("1.01", "0.01", "0.60")
    assert pool["idle_cost"] == "0.40" and pool["balances"] is True
    assert pool["utilization"] == "0.0004"  # 1.5 s busy of 3636 s held
    lines = {t["tenant_id"]: t for t in body["tenants"]}
    a, b = lines[tenants["a"]], lines[tenants["b"]]
    # Idle $0.40 by busy time 2:1 is 26.67 and 13.33 cents: the extra cent to the larger part.
    assert (a["idle_cost"], b["idle_cost"]) == ("0.27", "0.13")
    assert (a["device_cost"], b["device_cost"]) == ("0.40", "0.20")
    assert (a["revenue"], a["margin"]) == ("2.00", "1.33")
    assert (b["revenue"], b["margin"]) == ("0.90", "0.57")


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
