"""`/v1/files` over HTTP on the real app: OpenAI's shapes, the tenant triad on every route
(no key: 401; another tenant's file: 404; the owner: 200), and the upload limits as 4xx
in OpenAI's error shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from hydrant.platform.app import create_app
from hydrant.platform.keys import generate_key
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.services import build_services
from hydrant.settings import load_settings

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


class Api:
    def __init__(self, client: AsyncTestClient[Litestar], keys: dict[str, str]) -> None:
        self.client = client
        self.keys = keys

    def auth(self, tenant: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"} if tenant else {}

    async def upload(self, tenant: str | None, content: bytes, purpose: str = "batch") -> Any:
        return await self.client.post(
            "/v1/files",
            files={"file": ("input.jsonl", content, "application/jsonl")},
            data={"purpose": purpose},
            headers=self.auth(tenant),
        )


@pytest.fixture()
async def api(database_url: str, data_dir: Path) -> AsyncIterator[Api]:
    from hydrant.platform.db import migrate

    admin = generate_key("test").secret
    settings = load_settings(
        {},
        data_dir=data_dir,
        database_url=database_url,
        admin_bootstrap_key=admin,
        files_max_bytes=4096,
        files_max_lines=10,
    )
    await asyncio.to_thread(migrate.upgrade, database_url)
    services = build_services(settings, registry=ModelRegistry(), models=())
    async with AsyncTestClient(create_app(settings, services)) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        keys: dict[str, str] = {}
        for name in ("a", "b"):
            tenant = await client.post("/admin/tenants", json={"name": name}, headers=headers)
            key = await client.post(
                "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=headers
            )
            keys[name] = key.json()["secret"]
        yield Api(client, keys)


def _error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


async def test_the_tenant_triad_on_every_route(api: Api) -> None:
    created = await api.upload("a", LINE * 2)
    assert created.status_code == 200, created.text
    file = created.json()
    assert file["object"] == "file" and file["purpose"] == "batch"
    assert file["bytes"] == 2 * len(LINE)
    assert file["filename"] == "input.jsonl" and file["status"] == "processed"
    assert file["expires_at"] > file["created_at"]
    file_id = file["id"]
    routes = [
        ("get", f"/v1/files/{file_id}"),
        ("get", f"/v1/files/{file_id}/content"),
        ("delete", f"/v1/files/{file_id}"),
    ]
    for method, path in routes:
        anonymous = await getattr(api.client, method)(path)
        assert anonymous.status_code == 401 and _error(anonymous)["code"] == "invalid_api_key"
        other = await getattr(api.client, method)(path, headers=api.auth("b"))
        assert other.status_code == 404 and _error(other)["code"] == "not_found"
    assert (await api.client.get("/v1/files")).status_code == 401
    assert (await api.upload(None, LINE)).status_code == 401
    listed = await api.client.get("/v1/files", headers=api.auth("b"))
    assert listed.json()["data"] == []
    own = await api.client.get("/v1/files", headers=api.auth("a"))
    assert own.status_code == 200 and own.json()["object"] == "list"
    assert [f["id"] for f in own.json()["data"]] == [file_id]
    assert own.json()["first_id"] == own.json()["last_id"] == file_id
    retrieved = await api.client.get(f"/v1/files/{file_id}", headers=api.auth("a"))
    assert retrieved.status_code == 200 and retrieved.json() == file
    content = await api.client.get(f"/v1/files/{file_id}/content", headers=api.auth("a"))
    assert content.status_code == 200 and content.content == LINE * 2
    deleted = await api.client.delete(f"/v1/files/{file_id}", headers=api.auth("a"))
    assert deleted.status_code == 200
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    gone = await api.client.get(f"/v1/files/{file_id}", headers=api.auth("a"))
    assert gone.status_code == 404


async def test_uploads_over_the_limits_are_openai_errors(api: Api) -> None:
    for content in (LINE * 100, LINE * 10_000):  # over the file limit; over the body limit
        too_big = await api.upload("a", content)
        assert too_big.status_code == 413 and _error(too_big)["code"] == "payload_too_large"
    too_long = await api.upload("a", b"{}\n" * 11)
    assert too_long.status_code == 400 and _error(too_long)["param"] == "file"
    purpose = await api.upload("a", LINE, purpose="assistants")
    assert purpose.status_code == 400 and _error(purpose)["param"] == "purpose"
    no_file = await api.client.post("/v1/files", data={"purpose": "batch"}, headers=api.auth("a"))
    assert no_file.status_code == 400 and _error(no_file)
    bad_limit = await api.client.get("/v1/files?limit=0", headers=api.auth("a"))
    assert bad_limit.status_code == 400 and _error(bad_limit)["param"] == "limit"
