"""Requests through the official `openai` client land in the ledger with their key's
project, the HMAC of their end user (never the raw id) and their tags, and group by each
in the reports; bad tags are a 400 naming the param; a project's budget stricter than
its tenant's refuses first. The real app in-process with the demo engine, on SQLite with
the in-memory limiter and on PostgreSQL with Redis (the quota script)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from hydrant.platform.app import create_app
from hydrant.platform.db.models import LedgerEntry
from hydrant.platform.keys import generate_key
from hydrant.platform.server_secret import derive_key
from hydrant.platform.services import build_services, services_of
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings

SECRET = "attribution-test-secret-0123456789"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


@dataclass
class Gateway:
    client: AsyncTestClient[Litestar]
    admin: dict[str, str]
    tenant_id: str
    project_id: str
    project_key_id: str
    project_oai: openai.AsyncOpenAI
    tenant_oai: openai.AsyncOpenAI  # a tenant-level key of the same tenant

    async def entries(self) -> list[LedgerEntry]:
        async def run() -> list[LedgerEntry]:
            async with services_of(self.client.app).database.session() as session:
                return list(await session.scalars(select(LedgerEntry)))

        return await asyncio.to_thread(self.client.blocking_portal.call, run)


def _oai(client: AsyncTestClient[Litestar], secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{str(client.base_url).rstrip('/')}/v1",
        api_key=secret,
        http_client=client,
        max_retries=0,
    )


@pytest.fixture()
async def gateway(
    database_url: str, demo_model_dir: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Gateway]:
    admin = generate_key("test").secret
    overrides: dict[str, Any] = {}
    if database_url.startswith("postgresql"):
        overrides["redis_url"] = request.getfixturevalue("redis_url")
    settings = load_settings(
        {},
        data_dir=tmp_path,
        database_url=database_url,
        secret_key=SECRET,
        models=(ModelSpec("demo", demo_model_dir),),
        admin_bootstrap_key=admin,
        kv_cache_bytes=16 * 1024 * 1024,
        **overrides,
    )
    engines = load_embedded_engines(settings)
    services = build_services(settings, registry=engines.registry)
    services.on_stop.append(engines.shutdown)
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        plan = await client.post(
            "/admin/plans", json={"name": "roomy", "tokens_per_day": 1_000_000}, headers=headers
        )
        assert plan.status_code == 201, plan.text
        tenant = (
            await client.post(
                "/admin/tenants", json={"name": "t", "plan": "roomy"}, headers=headers
            )
        ).json()
        project = await client.post(
            f"/admin/tenants/{tenant['id']}/projects", json={"name": "web"}, headers=headers
        )
        assert project.status_code == 201, project.text
        in_project = await client.post(
            "/admin/keys", json={"tenant_id": tenant["id"], "project": "web"}, headers=headers
        )
        tenant_level = await client.post(
            "/admin/keys", json={"tenant_id": tenant["id"]}, headers=headers
        )
        yield Gateway(
            client,
            headers,
            tenant["id"],
            project.json()["id"],
            in_project.json()["key"]["id"],
            _oai(client, in_project.json()["secret"]),
            _oai(client, tenant_level.json()["secret"]),
        )


def expected_hash(tenant_id: str, user: str) -> str:
    key = derive_key(SECRET.encode(), "ledger-end-user")
    return hmac.new(key, f"{tenant_id}\x00{user}".encode(), hashlib.sha256).hexdigest()


async def test_user_and_tags_land_hashed_in_the_ledger_and_group_in_reports(
    gateway: Gateway,
) -> None:
    await gateway.project_oai.chat.completions.create(
        model="demo",
        messages=MESSAGES,
        max_tokens=4,
        user="alice@example.com",
        metadata={"team": "search"},
        extra_headers={"x-hydrant-tags": "env=prod, feature=autocomplete"},
    )
    await gateway.tenant_oai.completions.create(
        model="demo", prompt="hi", max_tokens=2, extra_body={"safety_identifier": "bob"}
    )
    entries = {e.api_key_id == gateway.project_key_id: e for e in await gateway.entries()}
    mine, other = entries[True], entries[False]
    alice = expected_hash(gateway.tenant_id, "alice@example.com")
    assert mine.project_id == gateway.project_id
    assert mine.end_user == alice
    assert mine.tags == {"team": "search", "env": "prod", "feature": "autocomplete"}
    assert "alice" not in repr(vars(mine))  # the raw id is stored nowhere in the row
    assert (other.project_id, other.tags) == (None, None)
    assert other.end_user == expected_hash(gateway.tenant_id, "bob")

    async def report(by: str) -> dict[str | None, int]:
        response = await gateway.client.get(
            "/admin/reports/costs", params={"by": by}, headers=gateway.admin
        )
        assert response.status_code == 200, response.text
        assert response.json()["period"]["by"] == by
        return {row["group"]: row["requests"] for row in response.json()["data"]}

    assert await report("project") == {gateway.project_id: 1, None: 1}
    assert await report("user") == {alice: 1, expected_hash(gateway.tenant_id, "bob"): 1}
    assert await report("tag:team") == {"search": 1, None: 1}
    assert (await report("key"))[gateway.project_key_id] == 1
    csv = await gateway.client.get(
        "/admin/reports/costs", params={"by": "tag:env", "format": "csv"}, headers=gateway.admin
    )
    header, *lines = csv.text.splitlines()
    assert header.split(",")[-1] == "group" and sorted(line.split(",")[-1] for line in lines) == [
        "",
        "prod",
    ]
    # The tenant's own usage view, by tag, through its own key.
    own = await gateway.project_oai.get(
        "/usage", cast_to=object, options={"params": {"by": "tag:feature"}}
    )
    assert {r["group"]: r["requests"] for r in own["data"]} == {"autocomplete": 1, None: 1}  # type: ignore[index]
    # OpenAI's usage API: project_id is the project (the tenant for a tenant-level key).
    usage = await gateway.client.get(
        "/v1/organization/usage/completions",
        params={
            "start_time": int(time.time()) - 86400,
            "end_time": int(time.time()) + 3600,
            "group_by": ["project_id", "user_id"],
        },
        headers=gateway.admin,
    )
    assert usage.status_code == 200, usage.text
    results = [r for bucket in usage.json()["data"] for r in bucket["results"]]
    assert {(r["project_id"], r["user_id"]) for r in results} == {
        (gateway.project_id, alice),
        (gateway.tenant_id, expected_hash(gateway.tenant_id, "bob")),
    }


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"metadata": {"team": "two words"}}, "metadata"),
        ({"metadata": {"bad key!": "x"}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(11)}}, "metadata"),
        ({"extra_headers": {"x-hydrant-tags": "novalue"}}, "x-hydrant-tags"),
        ({"extra_headers": {"x-hydrant-tags": "a=" + "x" * 65}}, "x-hydrant-tags"),
        ({"user": "has a space"}, "user"),
        ({"extra_body": {"safety_identifier": "x" * 257}}, "safety_identifier"),
    ],
)
async def test_bad_tags_and_user_ids_are_a_400_naming_the_param(
    gateway: Gateway, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await gateway.project_oai.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=4, **kwargs
        )
    assert info.value.status_code == 400
    assert info.value.param == param
    assert await gateway.entries() == []  # refused before it ran: nothing to record


async def test_project_and_key_budgets_stricter_than_the_tenants_refuse_first(
    gateway: Gateway,
) -> None:
    tight = await gateway.client.patch(
        f"/admin/tenants/{gateway.tenant_id}/projects/{gateway.project_id}",
        json={"tokens_per_day": 5},  # below one request's reservation; the tenant has 1M
        headers=gateway.admin,
    )
    assert tight.status_code == 200, tight.text
    with pytest.raises(openai.RateLimitError) as info:
        await gateway.project_oai.chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=4
        )
    assert info.value.code == "project_tokens_day"
    assert "project" in info.value.message
    # A key's own budget refuses it while its project and tenant have room.
    made = await gateway.client.post(
        "/admin/keys",
        json={"tenant_id": gateway.tenant_id, "tokens_per_day": 5},
        headers=gateway.admin,
    )
    with pytest.raises(openai.RateLimitError) as info:
        await _oai(gateway.client, made.json()["secret"]).chat.completions.create(
            model="demo", messages=MESSAGES, max_tokens=4
        )
    assert info.value.code == "key_tokens_day"
    # The tenant's own budget has room: its tenant-level key is served.
    served = await gateway.tenant_oai.chat.completions.create(
        model="demo", messages=MESSAGES, max_tokens=4
    )
    assert served.usage is not None and served.usage.total_tokens > 0


async def test_a_keys_budget_changed_after_creation_applies_to_its_next_request(
    gateway: Gateway,
) -> None:
    """The gateway caches the key's principal with its budgets: a change through
    `PATCH /admin/keys/{id}` drops it, so the next request meets the new limit."""
    made = await gateway.client.post(
        "/admin/keys",
        json={"tenant_id": gateway.tenant_id, "tokens_per_day": 5},
        headers=gateway.admin,
    )
    key = _oai(gateway.client, made.json()["secret"])
    with pytest.raises(openai.RateLimitError) as info:
        await key.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4)
    assert info.value.code == "key_tokens_day"
    url = f"/admin/keys/{made.json()['key']['id']}"
    raised = await gateway.client.patch(url, json={"tokens_per_day": None}, headers=gateway.admin)
    assert raised.status_code == 200 and raised.json()["tokens_per_day"] is None
    served = await key.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4)
    assert served.usage is not None and served.usage.total_tokens > 0
    lowered = await gateway.client.patch(url, json={"tokens_per_day": 5}, headers=gateway.admin)
    assert lowered.status_code == 200
    with pytest.raises(openai.RateLimitError) as info:
        await key.chat.completions.create(model="demo", messages=MESSAGES, max_tokens=4)
    assert info.value.code == "key_tokens_day"
