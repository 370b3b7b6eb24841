"""A gateway with the real demo-model engine in-process and its jobs on its loop, and the
helpers the batch tests share (a module, not conftest, so tests import it by name)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import select

from hydrant.platform.app import create_app
from hydrant.platform.db import migrate
from hydrant.platform.db.models import LedgerEntry
from hydrant.platform.keys import generate_key
from hydrant.platform.services import Services, build_services, services_of
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings

TERMINAL = ("completed", "failed", "expired", "cancelled")


def chat_line(custom_id: str, text: str, max_tokens: int = 8, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "demo",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **body,
        },
    }


def jsonl(lines: Iterable[Any]) -> bytes:
    return "".join(
        (line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines
    ).encode()


@dataclass
class Gateway:
    client: AsyncTestClient[Litestar]
    admin: str

    @property
    def services(self) -> Services:
        return services_of(self.client.app)

    def auth(self, key: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def tenant(self, name: str, plan: dict[str, Any] | None = None) -> tuple[str, str]:
        headers = self.auth(self.admin)
        body: dict[str, Any] = {"name": name}
        if plan is not None:
            made = await self.client.post(
                "/admin/plans", json={"name": f"plan-{name}", **plan}, headers=headers
            )
            assert made.status_code == 201, made.text
            body["plan"] = made.json()["id"]
        tenant = await self.client.post("/admin/tenants", json=body, headers=headers)
        key = await self.client.post(
            "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=headers
        )
        return tenant.json()["id"], key.json()["secret"]

    async def upload(self, key: str, content: bytes) -> str:
        response = await self.client.post(
            "/v1/files",
            files={"file": ("in.jsonl", content, "application/jsonl")},
            data={"purpose": "batch"},
            headers=self.auth(key),
        )
        assert response.status_code == 200, response.text
        return str(response.json()["id"])

    async def create(self, key: str, content: bytes, endpoint: str = "/v1/chat/completions") -> Any:
        file_id = await self.upload(key, content)
        return await self.client.post(
            "/v1/batches",
            json={"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"},
            headers=self.auth(key),
        )

    async def wait(
        self, key: str, batch_id: str, until: tuple[str, ...] = TERMINAL, timeout_s: float = 120
    ) -> dict[str, Any]:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            got = await self.client.get(f"/v1/batches/{batch_id}", headers=self.auth(key))
            batch = got.json()
            if batch["status"] in until:
                return dict(batch)
            assert asyncio.get_running_loop().time() < deadline, batch
            await asyncio.sleep(0.2)

    async def content(self, key: str, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        got = await self.client.get(f"/v1/files/{file_id}/content", headers=self.auth(key))
        assert got.status_code == 200, got.text
        return [json.loads(line) for line in got.content.splitlines()]

    async def ledger(self, **where: Any) -> list[LedgerEntry]:
        async def read() -> list[LedgerEntry]:
            async with self.services.database.session() as session:
                statement = select(LedgerEntry).filter_by(**where)
                return list((await session.scalars(statement)).all())

        return await asyncio.to_thread(self.client.blocking_portal.call, read)


@asynccontextmanager
async def gateway(data_dir: Path, model_dir: Path, **settings: Any) -> AsyncIterator[Gateway]:
    admin = generate_key("test").secret
    config = load_settings(
        {},
        data_dir=data_dir,
        models=(ModelSpec("demo", model_dir),),
        admin_bootstrap_key=admin,
        kv_cache_bytes=16 * 1024 * 1024,
        **settings,
    )
    await asyncio.to_thread(migrate.upgrade, config.effective_database_url)
    engines = load_embedded_engines(config)
    services = build_services(config, registry=engines.registry, run_jobs=True)
    services.on_stop.append(engines.shutdown)
    async with AsyncTestClient(create_app(config, services)) as client:
        yield Gateway(client, admin)
