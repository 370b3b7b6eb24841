"""`/healthz` and `/readyz` through a real ASGI client, against real databases."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from litestar.testing import AsyncTestClient

from hydrant.platform.app import create_app
from hydrant.platform.db import migrate
from hydrant.platform.services import build_services
from hydrant.settings import ModelSpec, load_settings


def _fake_checkpoint(path: Path, architecture: str = "LlamaForCausalLM") -> Path:
    """Only the files readiness looks at (it never loads weights)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"architectures": [architecture]}))
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    (path / "tokenizer.json").write_text("{}")
    return path


async def _get(
    url: str, models: tuple[ModelSpec, ...], tmp_path: Path, route: str
) -> tuple[int, dict]:
    settings = load_settings({}, data_dir=tmp_path, database_url=url)
    app = create_app(settings, build_services(settings, models=models))
    async with AsyncTestClient(app) as client:
        response = await client.get(route)
        return response.status_code, response.json()


async def test_healthz_answers_without_a_database(tmp_path: Path) -> None:
    status, body = await _get(
        "postgresql+asyncpg://nobody@127.0.0.1:1/none", (), tmp_path, "/healthz"
    )
    assert (status, body) == (200, {"status": "ok"})


async def test_ready_when_migrated_and_model_loadable(database_url: str, tmp_path: Path) -> None:
    model = ModelSpec("demo", _fake_checkpoint(tmp_path / "m"))
    status, body = await _get(database_url, (model,), tmp_path, "/readyz")
    assert status == 200, body
    assert body["status"] == "ready"
    assert body["checks"]["model:demo"] == {"ok": True, "detail": "loadable"}


async def test_not_ready_before_migrations(empty_database_url: str, tmp_path: Path) -> None:
    status, body = await _get(empty_database_url, (), tmp_path, "/readyz")
    assert status == 503
    assert body["checks"]["database"]["ok"] is True
    assert "hydrant migrate" in body["checks"]["migrations"]["detail"]


async def test_not_ready_when_database_unreachable(tmp_path: Path) -> None:
    status, body = await _get(
        "postgresql+asyncpg://nobody@127.0.0.1:1/none", (), tmp_path, "/readyz"
    )
    assert status == 503
    assert body["checks"]["database"]["ok"] is False


@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "BertModel"])
async def test_not_ready_when_model_cannot_be_served(
    fresh_sqlite_url: str, tmp_path: Path, architecture: str
) -> None:
    await asyncio.to_thread(migrate.upgrade, fresh_sqlite_url)
    bad = ModelSpec("gpt2", _fake_checkpoint(tmp_path / "g", architecture))
    missing = ModelSpec("gone", tmp_path / "nowhere")
    status, body = await _get(fresh_sqlite_url, (bad, missing), tmp_path, "/readyz")
    assert status == 503
    assert "not supported" in body["checks"]["model:gpt2"]["detail"]
    assert "not a directory" in body["checks"]["model:gone"]["detail"]
