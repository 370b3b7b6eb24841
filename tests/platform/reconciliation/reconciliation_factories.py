"""A known day for the reconciliation's API and page tests: a worker's timeline and three
ledger entries of two tenants, and the figures that day must show."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from control_plane_helpers import ControlPlane
from report_factories import add_models, add_tenants, insert_rows, row

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.reconciliation.recorder import TimelineRecorder
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
