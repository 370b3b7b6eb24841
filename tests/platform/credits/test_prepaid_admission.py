"""A prepaid tenant is served while its credits cover each request's maximum cost, then
refused as OpenAI refuses an account out of credit; what it spent is paid from its grants.

The real app in-process (demo engine, SQLite, real auth and ledger), with the in-memory
limiter and with real Redis; requests go through the official `openai` client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import openai
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import func, select

from hydrant.platform.app import create_app
from hydrant.platform.db import migrate
from hydrant.platform.db.models import CreditApplication, LedgerEntry
from hydrant.platform.keys import generate_key
from hydrant.platform.services import build_services, services_of
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings

MESSAGES = [{"role": "user", "content": "hi"}]
PRICE = Decimal("1000")  # per million tokens, in and out: a token costs 0.001


@dataclass
class Prepaid:
    client: AsyncTestClient[Litestar]
    oai: openai.AsyncOpenAI
    admin: dict[str, str]
    tenant_id: str
    key: dict[str, str]

    async def scalar(self, statement: object) -> object:
        async def run() -> object:
            async with services_of(self.client.app).database.session() as session:
                return await session.scalar(statement)  # type: ignore[call-overload]

        return await asyncio.to_thread(self.client.blocking_portal.call, run)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def prepaid(
    request: pytest.FixtureRequest, demo_model_dir: Path, tmp_path: Path
) -> AsyncIterator[Prepaid]:
    admin = generate_key("test").secret
    overrides: dict[str, object] = {}
    if request.param == "redis":
        overrides["redis_url"] = request.getfixturevalue("redis_url")
    settings = load_settings(
        {},
        data_dir=tmp_path,
        models=(ModelSpec("demo", demo_model_dir),),
        admin_bootstrap_key=admin,
        kv_cache_bytes=16 * 1024 * 1024,
        price_input_per_mtok=PRICE,
        price_cached_input_per_mtok=PRICE,
        price_output_per_mtok=PRICE,
        **overrides,  # type: ignore[arg-type]
    )
    await asyncio.to_thread(migrate.upgrade, settings.effective_database_url)
    engines = load_embedded_engines(settings)
    services = build_services(settings, registry=engines.registry)
    services.on_stop.append(engines.shutdown)
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        plan = await client.post(
            "/admin/plans", json={"name": "prepaid", "prepaid": True}, headers=headers
        )
        assert plan.status_code == 201 and plan.json()["prepaid"] is True, plan.text
        tenant = await client.post(
            "/admin/tenants", json={"name": "t", "plan": "prepaid"}, headers=headers
        )
        tenant_id = tenant.json()["id"]
        key = await client.post("/admin/keys", json={"tenant_id": tenant_id}, headers=headers)
        secret = key.json()["secret"]
        oai = openai.AsyncOpenAI(  # shares the test client, closed with it
            base_url=f"{str(client.base_url).rstrip('/')}/v1",
            api_key=secret,
            http_client=client,
            max_retries=0,
        )
        yield Prepaid(client, oai, headers, tenant_id, {"Authorization": f"Bearer {secret}"})


async def test_no_credits_no_service_then_served_until_the_balance_runs_out(
    prepaid: Prepaid,
) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        await prepaid.oai.chat.completions.create(
            model="demo",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=4,
        )
    assert info.value.code == "insufficient_quota"
    assert info.value.type == "insufficient_quota"
    assert "balance is 0.000000 USD" in info.value.message

    granted = await prepaid.client.post(
        f"/admin/tenants/{prepaid.tenant_id}/credits",
        json={"kind": "promo", "amount": "0.05"},
        headers=prepaid.admin,
    )
    assert granted.status_code == 201, granted.text
    served = 0
    for _ in range(20):
        try:
            await prepaid.oai.chat.completions.create(
                model="demo",
                messages=MESSAGES,  # type: ignore[arg-type]
                max_tokens=4,
            )
            served += 1
        except openai.RateLimitError as exc:
            assert exc.code == "insufficient_quota"
            assert "prepaid balance is" in exc.message
            assert "retry-after" not in exc.response.headers  # waiting will not help
            break
    else:
        pytest.fail("the balance never ran out")
    assert served >= 2

    balance = (await prepaid.client.get("/account/balance", headers=prepaid.key)).json()
    available = Decimal(balance["available"])
    assert Decimal(0) <= available < Decimal("0.05")
    ledger = await prepaid.scalar(
        select(func.sum(LedgerEntry.charged)).where(LedgerEntry.tenant_id == prepaid.tenant_id)
    )
    applied = await prepaid.scalar(select(func.sum(CreditApplication.amount)))
    unpaid = await prepaid.scalar(select(func.count()).where(CreditApplication.grant_id.is_(None)))
    assert Decimal(str(applied)) == Decimal(str(ledger)) == Decimal("0.05") - available
    assert unpaid == 0


async def test_a_batch_reserves_its_maximum_cost_against_the_credits(prepaid: Prepaid) -> None:
    """A prepaid tenant's Batch API batch holds its maximum cost (at the batch price) from
    its credits when it is made, as its budgets would: refused while they cannot cover it."""
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "demo", "messages": MESSAGES, "max_tokens": 4},
        }
        for i in range(3)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = await prepaid.oai.files.create(file=("in.jsonl", content), purpose="batch")
    with pytest.raises(openai.RateLimitError) as info:
        await prepaid.oai.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert info.value.code == "insufficient_quota"
    assert "this batch could cost up to" in info.value.message

    granted = await prepaid.client.post(
        f"/admin/tenants/{prepaid.tenant_id}/credits",
        json={"kind": "paid", "amount": "1"},
        headers=prepaid.admin,
    )
    assert granted.status_code == 201, granted.text
    batch = await prepaid.oai.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status in ("in_progress", "validating")
