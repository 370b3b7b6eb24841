"""A batch reserves the budgets of the key that made it and of that key's project too, not
only its tenant's: a batch over either is refused at creation exactly as one over the
tenant's budget, and a batch that ran leaves the key's and the project's counters (the
ones interactive requests draw on) holding nothing and counting what its ledger charged.
Without this a key or project with a budget could spend without limit through batches."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from batch_helpers import Gateway, chat_line, gateway, jsonl

from hydrant.platform.batches.reservation import from_json, to_json
from hydrant.platform.billing.money import to_micro_units
from hydrant.platform.quotas import Admission, BudgetCheck, LimitUsage, TenantQuota
from hydrant.platform.quotas.plan import batch_checks, key_budget_checks, project_budget_checks
from hydrant.platform.quotas.policy import KeyQuota, ProjectQuota

LINES = [chat_line(f"q{i}", f"count to {i}", max_tokens=8) for i in range(3)]


async def _project(gw: Gateway, tenant_id: str, **limits: Any) -> str:
    made = await gw.client.post(
        f"/admin/tenants/{tenant_id}/projects",
        json={"name": "etl", **limits},
        headers=gw.auth(gw.admin),
    )
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


async def _key(gw: Gateway, tenant_id: str, **fields: Any) -> tuple[str, str]:
    """A new key of the tenant (with `project` and budgets as given): its id and secret."""
    made = await gw.client.post(
        "/admin/keys", json={"tenant_id": tenant_id, **fields}, headers=gw.auth(gw.admin)
    )
    assert made.status_code == 201, made.text
    return str(made.json()["key"]["id"]), str(made.json()["secret"])


async def _refused_with(gw: Gateway, key: str, code: str) -> None:
    """Refused as a batch over the tenant's budget is (test_batch_rules), nothing made."""
    refused = await gw.create(key, jsonl(LINES))
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["type"] == "insufficient_quota" and error["code"] == code, error
    listed = await gw.client.get("/v1/batches", headers=gw.auth(key))
    assert listed.json()["data"] == []


async def test_a_batch_over_its_keys_budget_is_refused(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir) as gw:
        tenant_id, plain = await gw.tenant("acme", plan={"spend_per_day": "100"})
        _, poor = await _key(gw, tenant_id, spend_per_day="0.000001")
        await _refused_with(gw, poor, "key_spend_day")
        # The tenant has room: its key without a budget of its own makes the same batch.
        fits = await gw.create(plain, jsonl(LINES))
        assert fits.status_code == 200 and fits.json()["status"] == "in_progress", fits.text


async def test_a_batch_over_its_projects_budget_is_refused(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir) as gw:
        tenant_id, plain = await gw.tenant("acme", plan={"tokens_per_day": 10**6})
        await _project(gw, tenant_id, tokens_per_day=5)  # below one line's maximum
        _, in_project = await _key(gw, tenant_id, project="etl")
        await _refused_with(gw, in_project, "project_tokens_day")
        fits = await gw.create(plain, jsonl(LINES))  # a tenant-level key: no project
        assert fits.status_code == 200 and fits.json()["status"] == "in_progress", fits.text


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def test_a_finished_batch_leaves_the_keys_and_projects_budgets_its_ledger_charge(
    data_dir: Path, demo_model_dir: Path, store: str, request: pytest.FixtureRequest
) -> None:
    settings = {"redis_url": request.getfixturevalue("redis_url")} if store == "redis" else {}
    async with gateway(data_dir, demo_model_dir, **settings) as gw:
        tenant_id, _ = await gw.tenant("acme")  # no plan: only the project and key limit
        budgets: dict[str, Any] = {"tokens_per_day": 10**6, "spend_per_day": "100"}
        project_id = await _project(gw, tenant_id, **budgets)
        key_id, key = await _key(gw, tenant_id, project="etl", **budgets)
        checks = _interactive_budget_checks(tenant_id, project_id, key_id)
        created = await gw.create(key, jsonl(LINES))
        assert created.status_code == 200, created.text
        held = await _usage(gw, checks)
        # The batch's maximum is held on every one of them while it runs (no line is stored
        # before the runner's first resync; a stored line's share is given back, not more).
        assert all(usage.reserved > 0 for usage in held.values()), held
        done = await gw.wait(key, created.json()["id"])
        assert done["status"] == "completed", done
        entries = await gw.ledger(batch_id=done["id"])
        assert len(entries) == len(LINES)
        spent = sum(to_micro_units(e.charged) for e in entries)
        tokens = sum(e.input_tokens + e.output_tokens for e in entries)
        assert spent > 0 and tokens > 0
        assert await _usage(gw, checks) == {
            "project_tokens_day": LimitUsage(used=tokens, reserved=0),
            "project_spend_day": LimitUsage(used=spent, reserved=0),
            "key_tokens_day": LimitUsage(used=tokens, reserved=0),
            "key_spend_day": LimitUsage(used=spent, reserved=0),
        }


def _interactive_budget_checks(
    tenant_id: str, project_id: str, key_id: str
) -> tuple[BudgetCheck, ...]:
    """Today's project and key budget counters, built as the interactive path builds them
    (`build_checks` calls these): a batch on other counters would not be seen here."""
    tag = "{" + tenant_id + "}"
    limit = Decimal(1)
    project = ProjectQuota(project_id, tokens_per_day=1, spend_per_day=limit)
    key = KeyQuota(key_id, tokens_per_day=1, spend_per_day=limit)
    at = datetime.now(UTC)
    return (
        *project_budget_checks(tag, project, 0, 0, at, 60),
        *key_budget_checks(tag, key, 0, 0, at, 60),
    )


async def _usage(gw: Gateway, checks: tuple[BudgetCheck, ...]) -> dict[str, LimitUsage]:
    backend = gw.services.inference.quota_backend
    portal = gw.client.blocking_portal
    return {c.name: await asyncio.to_thread(portal.call, backend.usage, c) for c in checks}


def test_the_reservation_on_the_row_keeps_the_key_and_project_checks() -> None:
    """The row's JSON brings back every check by name and counter, so any runner (after a
    restart too) settles the key's and the project's share as well as the tenant's."""
    checks = batch_checks(
        tenant_id="ten_1",
        quota=TenantQuota(spend_per_day=Decimal(5)),
        reserve_tokens=900,
        reserve_money=Decimal("0.000123"),
        at=datetime(2026, 3, 1, 12, tzinfo=UTC),
        lease_s=90_000,
        project=ProjectQuota("prj_1", tokens_per_month=10**6),
        key_quota=KeyQuota("key_1", spend_per_month=Decimal("0.5")),
    )
    assert [c.name for c in checks] == ["spend_day", "project_tokens_month", "key_spend_month"]
    back = from_json(to_json(Admission("batch_1", checks)))
    assert back is not None and back.checks == checks
