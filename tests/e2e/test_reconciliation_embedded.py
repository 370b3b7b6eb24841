"""A real run's day reconciles (issue #26): `hydrant serve` on the embedded default, its
engine in a child process, two tenants' requests; the day's reconciliation balances to
the cent, its held time is the child's life as its registry record tells it, and its
request cost is the ledger's device cost read from the database directly.

The device is priced at $3,600 an hour ($1 a second), so the seconds of a short run
show as dollars and a timeline that lost or invented a second would show.
"""

from __future__ import annotations

import json
import sqlite3
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import openai
import pytest
from hydrant_server import RunningServer, hydrant_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENV = {
    "HYDRANT_POOL_WAKE_TIMEOUT_S": "30",
    "HYDRANT_TIMELINE_SAMPLE_S": "0.2",
    "HYDRANT_DEVICE_PRICE_PER_HOUR": "3600",
}
CENT = Decimal("0.01")


def child_started_at(server: RunningServer) -> float:
    (record,) = (server.data_dir / "workers" / f"serve-{server.process.pid}").glob("*.json")
    return float(json.loads(record.read_text())["started_at"])


def ledger_device_cost(server: RunningServer, day: str) -> Decimal:
    """The exact sum of the day's per-request device cost, as stored (6 places)."""
    with sqlite3.connect(server.data_dir / "hydrant.db") as db:
        rows = db.execute(
            "SELECT device_cost FROM ledger_entries WHERE date(finished_at) = ?", (day,)
        ).fetchall()
    return sum((Decimal(str(r[0])).quantize(Decimal("0.000001")) for r in rows), Decimal(0))


def test_a_days_reconciliation_of_a_real_run_balances(tmp_path: Path, demo_model_dir: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with hydrant_server(data, demo_model_dir, env=ENV) as server:
        started = child_started_at(server)
        tenants = {}
        for name, requests in (("alpha", 3), ("beta", 1)):
            tenant_id, secret = server.tenant_key(name)
            tenants[name] = tenant_id
            with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret) as client:
                for _ in range(requests):
                    done = client.completions.create(
                        model="demo", prompt="The river", max_tokens=16, temperature=0
                    )
                    assert done.usage is not None and done.usage.completion_tokens > 0
        day = datetime.now(UTC).date().isoformat()
        time.sleep(1.5)  # a heartbeat or two of idle time, recorded
        with server.admin() as admin:
            asked_at = time.time()
            response = admin.get("/admin/reports/reconciliation", params={"day": day})
            costs = admin.get("/admin/reports/costs", params={"since": day, "group_by": "day"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert costs.status_code == 200, costs.text

    (pool,) = body["pools"]
    assert pool["model"] == "demo" and pool["balances"] is True
    parts = ("request_cost", "idle_cost", "load_cost", "drain_cost", "asleep_cost")
    assert Decimal(pool["held_cost"]) == sum(Decimal(pool[p]) for p in parts)
    # Held: the child's life from its start to the last heartbeat recorded (a heartbeat a
    # second, sampled every 0.2 s; slack for a loaded machine), and at $1 a second its
    # cost is those seconds in cents.
    held = Decimal(pool["held_seconds"])
    assert Decimal(asked_at - started) - 6 < held <= Decimal(asked_at - started)
    assert Decimal(pool["held_cost"]) == held.quantize(CENT)
    assert Decimal(pool["load_hours"]) > 0  # the child loaded its model first
    assert Decimal(pool["busy_hours"]) > 0 and Decimal(pool["idle_cost"]) > 0
    # Request cost: the ledger's device cost, summed from the database, in cents.
    assert Decimal(pool["request_cost"]) == ledger_device_cost(server, day).quantize(CENT)

    lines = {t["tenant_id"]: t for t in body["tenants"]}
    assert set(lines) == set(tenants.values())
    assert sum(Decimal(t["idle_cost"]) for t in lines.values()) == Decimal(pool["idle_cost"])
    assert sum(Decimal(t["device_cost"]) for t in lines.values()) == Decimal(pool["request_cost"])
    charged = {r["tenant_id"]: Decimal(r["charged"]) for r in costs.json()["data"]}
    for tenant_id, line in lines.items():
        assert Decimal(line["revenue"]) == charged[tenant_id].quantize(CENT)
        margin = (
            Decimal(line["revenue"]) - Decimal(line["device_cost"]) - Decimal(line["idle_cost"])
        )
        assert Decimal(line["margin"]) == margin
    # Three requests took more busy time, so more of the idle cost, than one.
    alpha, beta = lines[tenants["alpha"]], lines[tenants["beta"]]
    assert Decimal(alpha["busy_hours"]) > Decimal(beta["busy_hours"])
    assert Decimal(alpha["idle_cost"]) >= Decimal(beta["idle_cost"])
