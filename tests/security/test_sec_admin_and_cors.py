"""The full gateway app (control plane, `/v1`, engines admin, web pages), walked route by route.

Every `/admin` route, including ones added later, must refuse a tenant's
inference key; CORS stays closed unless origins are named.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from control_plane_helpers import SERVER_SECRET, bearer
from litestar import Litestar
from litestar.routes import HTTPRoute
from litestar.testing import AsyncTestClient

from hydrant.errors import ConfigurationError
from hydrant.platform.app import create_app
from hydrant.platform.auth.key_codec import generate_key
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.services import build_services
from hydrant.settings import Settings, load_settings

FOREIGN = "https://evil.example"


def _settings(database_url: str, data_dir: Path, admin: str, **extra: object) -> Settings:
    return load_settings(
        {},
        data_dir=data_dir,
        database_url=database_url,
        secret_key=SERVER_SECRET,
        admin_bootstrap_key=admin,
        key_env="test",
        **extra,
    )


async def _full_app(settings: Settings) -> Litestar:
    """`create_app` as `hydrant serve` calls it (with a gateway), minus the engines."""
    return create_app(settings, build_services(settings, registry=ModelRegistry(), models=()))


@pytest.fixture()
async def full(
    database_url: str, data_dir: Path
) -> AsyncIterator[tuple[AsyncTestClient[Litestar], str, str]]:
    admin = generate_key("test").secret
    app = await _full_app(_settings(database_url, data_dir, admin))
    async with AsyncTestClient(app) as client:
        tenant = await client.post("/admin/tenants", json={"name": "t"}, headers=bearer(admin))
        key = await client.post(
            "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=bearer(admin)
        )
        assert key.status_code == 201, key.text
        yield client, admin, key.json()["secret"]


def _admin_routes(app: Litestar) -> list[tuple[str, str]]:
    found = []
    for route in app.routes:
        if not isinstance(route, HTTPRoute) or "/admin" not in route.path:
            continue
        path = re.sub(r"\{(\w+):\w+\}", "obj_x", route.path)
        found.extend((m, path) for m in sorted(route.methods) if m not in ("OPTIONS", "HEAD"))
    return found


async def test_no_admin_route_answers_an_inference_key(
    full: tuple[AsyncTestClient[Litestar], str, str],
) -> None:
    client, admin, tenant_secret = full
    routes = _admin_routes(client.app)
    api = [(m, p) for m, p in routes if p.startswith("/admin/")]
    assert len(api) >= 20 and ("GET", "/admin/engines") in api, routes
    for method, path in routes:
        response = await client.request(
            method, path, json={"junk": True}, headers=bearer(tenant_secret)
        )
        if path.startswith("/admin/"):
            assert response.status_code == 403, (method, path, response.text)
            assert response.json()["error"]["type"] == "permission_error"
        else:  # a web page: the bearer key is no session; never the page itself
            assert response.status_code in (302, 303, 401, 403), (method, path, response.text)
        anonymous = await client.request(method, path, json={"junk": True})
        assert anonymous.status_code in (302, 303, 401), (method, path)
    # The walk would notice an admin route that let tenants in: admins do get in.
    assert (await client.get("/admin/engines", headers=bearer(admin))).status_code == 200


async def test_cors_is_closed_by_default(
    full: tuple[AsyncTestClient[Litestar], str, str],
) -> None:
    client, admin, tenant_secret = full
    for path, headers in (("/v1/models", bearer(tenant_secret)), ("/admin/tenants", bearer(admin))):
        response = await client.get(path, headers={**headers, "origin": FOREIGN})
        assert response.status_code == 200
        assert "access-control-allow-origin" not in response.headers
        preflight = await client.options(
            path,
            headers={
                "origin": FOREIGN,
                "access-control-request-method": "GET",
                "access-control-request-headers": "authorization",
            },
        )
        assert "access-control-allow-origin" not in preflight.headers
        assert "access-control-allow-credentials" not in preflight.headers


async def test_named_cors_origins_open_only_to_them(database_url: str, data_dir: Path) -> None:
    admin = generate_key("test").secret
    named = "https://console.example.com"
    settings = _settings(database_url, data_dir, admin, cors_origins=f"{named}, https://b.example")
    async with AsyncTestClient(await _full_app(settings)) as client:
        ok = await client.get("/admin/tenants", headers={**bearer(admin), "origin": named})
        assert ok.headers["access-control-allow-origin"] == named
        assert "access-control-allow-credentials" not in ok.headers
        exposed = ok.headers["access-control-expose-headers"].lower()
        assert "x-ratelimit-remaining-requests" in exposed  # browser clients can pace
        preflight = await client.options(
            "/admin/tenants",
            headers={"origin": named, "access-control-request-method": "GET"},
        )
        assert preflight.status_code in (200, 204)
        assert preflight.headers["access-control-allow-origin"] == named
        other = await client.get("/admin/tenants", headers={**bearer(admin), "origin": FOREIGN})
        assert other.headers.get("access-control-allow-origin") not in (FOREIGN, "*")
        # a generation route, answered by the lean path (inference/lean_path.py): the same
        # CORS headers (here on its 401, the answer a browser without a key gets)
        lean = await client.post(
            "/v1/chat/completions",
            json={"model": "demo", "messages": []},
            headers={"origin": named},
        )
        assert lean.status_code == 401
        assert lean.headers["access-control-allow-origin"] == named


@pytest.mark.parametrize("origins", ["*", "evil.example", "https://a.example,ftp://b"])
def test_cors_wildcards_and_non_origins_are_refused(origins: str, tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path, cors_origins=origins)
    with pytest.raises(ConfigurationError, match="HYDRANT_CORS_ORIGINS"):
        create_app(settings)


def test_the_openapi_schema_holds_no_secrets(tmp_path: Path) -> None:
    """The schema is public; it must carry routes and shapes only, never settings."""
    admin = generate_key("test").secret
    settings = load_settings(
        {}, data_dir=tmp_path, secret_key=SERVER_SECRET, admin_bootstrap_key=admin
    )
    app = create_app(settings)
    schema = app.openapi_schema.to_schema()
    text = str(schema)
    assert admin not in text and SERVER_SECRET not in text
    assert "/admin/tenants" in schema["paths"]
