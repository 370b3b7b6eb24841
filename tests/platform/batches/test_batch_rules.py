"""What a batch may be: bad lines fail it before any work (naming their lines), a batch
whose maximum cost does not fit the budget or whose prompt tokens overflow the plan's
queue limit is refused, a reservation is held and settled line by line, and a batch is
its tenant's alone (the triad on every route)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from batch_helpers import chat_line, gateway, jsonl

from hydrant.platform.billing.money import to_micro_units
from hydrant.platform.quotas import BudgetCheck, LimitUsage
from hydrant.platform.quotas.plan import batch_checks


async def test_bad_lines_fail_the_batch_before_any_work(
    data_dir: Path, demo_model_dir: Path
) -> None:
    good = chat_line("ok", "hello")
    lines: list[Any] = [
        good,  # 1
        "{not json",  # 2
        "",  # 3: blank lines are skipped, but counted
        chat_line("ok", "again"),  # 4: the same custom_id
        {**chat_line("m", "x"), "body": {**good["body"], "model": "nope"}},  # 5
        {**chat_line("u", "x"), "url": "/v1/completions"},  # 6
        chat_line("long", "x", max_tokens=10**6),  # 7: over the context
        chat_line("s", "x", stream=True),  # 8
        {**chat_line("t", "x"), "body": {**good["body"], "temperature": "hot"}},  # 9
    ]
    async with gateway(data_dir, demo_model_dir) as gw:
        _, key = await gw.tenant("acme")
        created = await gw.create(key, jsonl(lines))
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["status"] == "failed" and batch["failed_at"] is not None
        errors = {e["line"]: e for e in batch["errors"]["data"]}
        assert sorted(errors) == [2, 4, 5, 6, 7, 8, 9]
        assert errors[2]["code"] == "invalid_json_line"
        assert errors[4]["code"] == "duplicate_custom_id"
        assert errors[5]["code"] == "model_not_found" and errors[5]["param"] == "model"
        assert errors[6]["code"] == "invalid_url"
        assert errors[7]["code"] == "context_length_exceeded"
        assert errors[8]["param"] == "stream"
        assert errors[9]["param"] == "temperature"
        assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
        assert batch["output_file_id"] is None and batch["error_file_id"] is None
        assert await gw.ledger() == []
        bad_file = await gw.client.post(
            "/v1/batches",
            json={
                "input_file_id": "file-nope",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            headers=gw.auth(key),
        )
        assert bad_file.status_code == 404 and bad_file.json()["error"]["param"] == "input_file_id"
        file_id = await gw.upload(key, jsonl([good]))
        for field, value in (("endpoint", "/v1/images"), ("completion_window", "1h")):
            body = {
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                field: value,
            }
            refused = await gw.client.post("/v1/batches", json=body, headers=gw.auth(key))
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field


async def test_a_batch_over_the_budget_is_refused_and_one_within_it_settles(
    data_dir: Path, demo_model_dir: Path
) -> None:
    lines = [chat_line(f"q{i}", f"count to {i}", max_tokens=8) for i in range(3)]
    async with gateway(data_dir, demo_model_dir) as gw:
        tenant, poor = await gw.tenant("poor", plan={"spend_per_day": "0.000001"})
        refused = await gw.create(poor, jsonl(lines))
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["type"] == "insufficient_quota" and error["code"] == "spend_day"
        listed = await gw.client.get("/v1/batches", headers=gw.auth(poor))
        assert listed.json()["data"] == []

        tenant, rich = await gw.tenant(
            "rich", plan={"spend_per_day": "100", "tokens_per_day": 10**6}
        )
        created = (await gw.create(rich, jsonl(lines))).json()
        backend = gw.services.inference.quota_backend
        check = _spend_check(tenant)
        held = await _usage(gw, backend, check)
        assert held.reserved > 0  # the batch's maximum, held while it runs
        done = await gw.wait(rich, created["id"])
        assert done["status"] == "completed"
        entries = await gw.ledger(batch_id=done["id"])
        spent = sum(to_micro_units(e.charged) for e in entries)
        assert await _usage(gw, backend, check) == LimitUsage(used=spent, reserved=0)


def _spend_check(tenant_id: str) -> BudgetCheck:
    from datetime import UTC, datetime
    from decimal import Decimal

    from hydrant.platform.quotas.plan import TenantQuota

    quota = TenantQuota(spend_per_day=Decimal(100))
    (check,) = batch_checks(
        tenant_id=tenant_id,
        quota=quota,
        reserve_tokens=0,
        reserve_money=Decimal(0),
        at=datetime.now(UTC),
        lease_s=60,
    )
    return check


async def _usage(gw: Any, backend: Any, check: BudgetCheck) -> LimitUsage:
    import asyncio

    return await asyncio.to_thread(gw.client.blocking_portal.call, backend.usage, check)


async def test_the_queue_limit_counts_unfinished_batches_prompt_tokens(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir) as gw:
        _, key = await gw.tenant("q", plan={"batch_queue_tokens": 20})
        refused = await gw.create(key, jsonl([chat_line(f"q{i}", "a b c d e") for i in range(4)]))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "token_limit_exceeded"
        fits = await gw.create(key, jsonl([chat_line("one", "a")]))
        assert fits.status_code == 200 and fits.json()["status"] == "in_progress"


async def test_a_batch_is_its_tenants_alone(data_dir: Path, demo_model_dir: Path) -> None:
    async with gateway(data_dir, demo_model_dir) as gw:
        _, owner = await gw.tenant("owner")
        _, other = await gw.tenant("other")
        batch = (await gw.create(owner, jsonl([chat_line("a", "hi")]))).json()
        routes = [
            ("get", f"/v1/batches/{batch['id']}"),
            ("post", f"/v1/batches/{batch['id']}/cancel"),
        ]
        for method, route in routes:
            anonymous = await getattr(gw.client, method)(route)
            assert anonymous.status_code == 401
            foreign = await getattr(gw.client, method)(route, headers=gw.auth(other))
            assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "not_found"
        assert (await gw.client.get("/v1/batches")).status_code == 401
        assert (await gw.client.get("/v1/batches", headers=gw.auth(other))).json()["data"] == []
        file_id = await gw.upload(owner, jsonl([chat_line("a", "hi")]))
        stolen = await gw.client.post(
            "/v1/batches",
            json={
                "input_file_id": file_id,
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
            headers=gw.auth(other),
        )
        assert stolen.status_code == 404
        mine = await gw.client.get(f"/v1/batches/{batch['id']}", headers=gw.auth(owner))
        assert mine.status_code == 200 and mine.json()["id"] == batch["id"]
        page = (await gw.client.get("/v1/batches?limit=1", headers=gw.auth(owner))).json()
        assert [b["id"] for b in page["data"]] == [batch["id"]] and not page["has_more"]
        assert json.loads(json.dumps(page))["object"] == "list"
