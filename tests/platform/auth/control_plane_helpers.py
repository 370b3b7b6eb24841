"""A gateway with the control plane on a real database, a fake clock, and factories.

Shared by the auth, tenants and prices tests (their conftests put this folder
on `sys.path`). The app is the real `create_app`; only the authenticator is
swapped for one whose wall clock and cache clock the test moves by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from litestar import Litestar
from litestar.testing import AsyncTestClient
from sqlalchemy import Select

from hydrant.platform.app import create_app
from hydrant.platform.auth.from_settings import bootstrap_key
from hydrant.platform.auth.key_codec import generate_key
from hydrant.platform.auth.last_used import LastUsedRecorder
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.keys.service import store_bootstrap_key
from hydrant.platform.services import build_services, services_of
from hydrant.settings import Settings, load_settings

T = TypeVar("T")

SERVER_SECRET = "test-server-secret-0123456789abcdef"
INVALID_BODY = {
    "error": {
        "message": "invalid API key",
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


@dataclass
class FakeClock:
    """Wall time (expiry, grace) and monotonic time (cache TTL), moved together."""

    wall: datetime = field(default_factory=lambda: datetime(2026, 12, 2, 12, 0, tzinfo=UTC))
    mono: float = 1000.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


@dataclass
class ControlPlane:
    app: Litestar
    client: AsyncTestClient[Litestar]
    clock: FakeClock
    admin_secret: str
    settings: Settings

    @property
    def authenticator(self) -> Authenticator:
        return services_of(self.app).authenticator

    async def in_app(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run `fn` on the app's event loop (its connection pool lives there; asyncpg
        connections cannot cross loops), without blocking the test's loop."""
        return await asyncio.to_thread(self.client.blocking_portal.call, fn)

    async def execute(self, statement: Any) -> Any:
        """One statement in its own unit of work on the app's database; scalar result."""

        async def run() -> Any:
            async with services_of(self.app).database.session() as session:
                result = await session.execute(statement)
                return result.scalar() if isinstance(statement, Select) else None

        return await self.in_app(run)

    @property
    def admin(self) -> dict[str, str]:
        return bearer(self.admin_secret)

    async def create_tenant(self, name: str, **fields: Any) -> dict[str, Any]:
        response = await self.client.post(
            "/admin/tenants", json={"name": name, **fields}, headers=self.admin
        )
        assert response.status_code == 201, response.text
        return dict(response.json())

    async def create_key(self, tenant_id: str | None, **fields: Any) -> tuple[dict[str, Any], str]:
        response = await self.client.post(
            "/admin/keys", json={"tenant_id": tenant_id, **fields}, headers=self.admin
        )
        assert response.status_code == 201, response.text
        body = response.json()
        return dict(body["key"]), str(body["secret"])

    async def tenant_with_key(self, name: str) -> tuple[dict[str, Any], str]:
        tenant = await self.create_tenant(name)
        _, secret = await self.create_key(tenant["id"])
        return tenant, secret


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def control_plane_settings(database_url: str, data_dir: Path, admin_secret: str) -> Settings:
    return load_settings(
        {},
        data_dir=data_dir,
        database_url=database_url,
        secret_key=SERVER_SECRET,
        admin_bootstrap_key=admin_secret,
        key_env="test",
    )


@asynccontextmanager
async def control_plane(
    database_url: str, data_dir: Path, *, cache_ttl_s: float = 5.0
) -> AsyncIterator[ControlPlane]:
    admin_secret = generate_key("test").secret
    settings = control_plane_settings(database_url, data_dir, admin_secret)
    services = build_services(settings, models=())
    clock = FakeClock()
    services.auth.authenticator = Authenticator(
        services.database,
        lambda: SERVER_SECRET.encode(),
        cache_ttl_s=cache_ttl_s,
        clock=clock.now,
        monotonic=clock.monotonic,
        bootstrap_key=bootstrap_key(settings),
        store_bootstrap_key=store_bootstrap_key,
        # Tests flush by hand; a background flush mid-test would race their assertions.
        last_used=LastUsedRecorder(services.database, flush_every_s=3600),
    )
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        yield ControlPlane(app, client, clock, admin_secret, settings)
