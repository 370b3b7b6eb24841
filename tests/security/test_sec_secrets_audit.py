"""After a realistic session, no log line, error body, database column or data file holds a
key's secret or a prompt's text.

Builds on the single-request redaction check in `tests/e2e/test_openai_client.py`:
here a whole session runs against a real `hydrant serve` (SQLite and
PostgreSQL) that writes its log to a file: admin creates tenants, plans and
keys; chat and completions with a canary prompt, streamed and not; bad
requests built to tempt an echo (malformed JSON, wrong types, bad values,
all carrying the canary); wrong keys that carry a canary; a revoked key;
quota and budget refusals. Then everything is scanned. LiteLLM leaked keys in
errors, audit logs and debug logs (#18731, #31620, #30670): this is the test
that would have caught it. The key's display prefix and HMAC may appear.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server
from sqlalchemy import MetaData, inspect, select
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = pytest.mark.slow

PROMPT = f"canary-prompt-{uuid.uuid4().hex}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str | None:
    if request.param == "sqlite":
        return None  # the embedded default: data/hydrant.db
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture()
def server(database: str | None, demo_model_dir: Path, tmp_path: Path) -> Iterator[RunningServer]:
    env = {"HYDRANT_KEY_CACHE_TTL_S": "1", "HYDRANT_LOG_LEVEL": "DEBUG"}
    if database is not None:
        env["HYDRANT_DATABASE_URL"] = database
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with hydrant_server(data_dir, demo_model_dir, env=env) as running:
        yield running


class Session:
    """Sends the traffic and keeps every error body the client received."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self.http = httpx.Client(base_url=server.base_url, timeout=60)
        self.error_bodies: list[str] = []
        self.request_ids: list[str] = []

    def call(self, method: str, path: str, key: str | None, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        response = self.http.request(method, path, headers=headers, **kwargs)
        if response.status_code >= 400:
            self.error_bodies.append(response.text)
            self.error_bodies.extend(f"{k}: {v}" for k, v in response.headers.items())
        elif path in ("/v1/chat/completions", "/v1/completions"):
            self.request_ids.append(response.headers["x-request-id"])
        return response

    def admin(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = self.call(method, path, self.server.admin_key, **kwargs)
        assert response.status_code in (200, 201), response.text
        return dict(response.json())


def _chat(prompt: str = PROMPT, **extra: Any) -> dict[str, Any]:
    return {
        "model": "demo",
        "messages": [
            {"role": "system", "content": f"system {prompt}"},
            {"role": "user", "content": [{"type": "text", "text": prompt}]},
        ],
        "max_tokens": 4,
        **extra,
    }


def run_session(s: Session) -> list[str]:
    """The traffic; returns every key secret handed out (the canaries to look for)."""
    plan = s.admin("POST", "/admin/plans", json={"name": "tight", "tokens_per_day": 40})
    tenant = s.admin("POST", "/admin/tenants", json={"name": "audit"})
    tight = s.admin("POST", "/admin/tenants", json={"name": "tight", "plan": plan["id"]})
    issued = s.admin("POST", "/admin/keys", json={"tenant_id": tenant["id"]})
    key = issued["secret"]
    spare = s.admin("POST", "/admin/keys", json={"tenant_id": tenant["id"]})
    tight_key = s.admin("POST", "/admin/keys", json={"tenant_id": tight["id"]})["secret"]
    s.admin("GET", f"/admin/keys/{issued['key']['id']}")
    s.admin("GET", "/admin/keys")

    # Served: chat and completions, whole and streamed, with the canary prompt.
    for stream in (False, True):
        extra: dict[str, Any] = {"stream": stream}
        if stream:
            extra["stream_options"] = {"include_usage": True}
        assert s.call("POST", "/v1/chat/completions", key, json=_chat(**extra)).status_code == 200
        completion = {"model": "demo", "prompt": PROMPT, "max_tokens": 4, **extra}
        assert s.call("POST", "/v1/completions", key, json=completion).status_code == 200
    assert s.call("POST", "/v1/chat/completions", key, json=_chat(n=2, logprobs=True)).is_success
    batch = {"model": "demo", "prompt": [PROMPT, PROMPT + " again"], "max_tokens": 4}
    assert s.call("POST", "/v1/completions", key, json=batch).status_code == 200

    # Bad requests that a careless server would echo.
    bad_bodies: list[bytes | dict[str, Any]] = [
        f'{{"model": "demo", "messages": [{{"role": "user", "content": "{PROMPT}"'.encode(),
        _chat(max_tokens=PROMPT),
        _chat(temperature=-1),
        _chat(stop={"x": PROMPT}),
        _chat(top_logprobs=3),
        _chat(max_tokens=10**6),
        {"model": "demo", "messages": [{"role": PROMPT, "content": "hi"}]},
        {"model": "demo", "prompt": [PROMPT, [1, 2]]},  # a batch mixing forms
        {"model": "demo", "messages": [{"role": "user", "content": PROMPT * 3000}]},
    ]
    for body in bad_bodies:
        path = "/v1/completions" if isinstance(body, dict) and "prompt" in body else None
        kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
        response = s.call("POST", path or "/v1/chat/completions", key, **kwargs)
        assert 400 <= response.status_code < 500, (body, response.text)

    # Wrong keys that carry a canary, in every shape a client gets wrong.
    canary_keys = [
        f"hyd_live_{uuid.uuid4().hex}CANARYKEY",
        f"sk-canary-{uuid.uuid4().hex}",
        key[:-2] + ("zz" if not key.endswith("zz") else "yy"),
        key + "x",
    ]
    for wrong in canary_keys:
        assert s.call("POST", "/v1/chat/completions", wrong, json=_chat()).status_code == 401
        assert s.call("GET", "/admin/tenants", wrong).status_code == 401
    assert s.call("GET", "/v1/models", None).status_code == 401
    s.http.get("/v1/models", headers={"Authorization": key})  # no `Bearer`: still a 401
    assert s.call("GET", "/admin/tenants", key).status_code == 403  # right key, wrong scope

    # A revoked key.
    assert s.call("GET", "/v1/models", spare["secret"]).status_code == 200
    s.admin("POST", f"/admin/keys/{spare['key']['id']}/revoke")
    time.sleep(1.5)  # past the key cache TTL
    assert s.call("POST", "/v1/chat/completions", spare["secret"], json=_chat()).status_code == 401

    # Quota and budget refusals.
    refused = s.call("POST", "/v1/chat/completions", tight_key, json=_chat(max_tokens=64))
    assert refused.status_code in (402, 429), refused.text
    long_prompt = {"model": "demo", "prompt": PROMPT + " x" * 9000, "max_tokens": 4}
    assert s.call("POST", "/v1/completions", key, json=long_prompt).status_code in (413, 422)

    s.call("GET", "/v1/usage", key)
    s.admin("GET", "/admin/reports/costs")
    return [key, spare["secret"], tight_key, *canary_keys]


async def _database_text(url: str) -> list[str]:
    """Every value of every column of every table, as text."""
    engine = create_async_engine(url)
    values: list[str] = []
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: inspect(c).get_table_names())
            metadata = MetaData()
            await conn.run_sync(lambda c: metadata.reflect(c, only=names))
            for table in metadata.sorted_tables:
                for row in (await conn.execute(select(table))).all():
                    values.extend(repr(v) for v in row)
    finally:
        await engine.dispose()
    assert names and values
    return values


def _needles(secret: str) -> list[str]:
    """The secret, and its body without the public `hyd_<env>_` part (a leak of the rest)."""
    body = secret.split("_", 2)[-1]
    return [secret, body] if len(body) >= 16 else [secret]


def test_no_secret_or_prompt_survives_a_session(
    server: RunningServer, database: str | None
) -> None:
    session = Session(server)
    keys = run_session(session)
    metrics = session.http.get("/metrics").text
    session.http.close()
    assert server.stop() in (0, -15)  # graceful (uvicorn re-raises SIGTERM once shut down)

    url = database or f"sqlite+aiosqlite:///{server.data_dir / 'hydrant.db'}"
    columns = asyncio.run(_database_text(url))
    log_lines = server.log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    files = {
        path: path.read_bytes().decode("latin-1")
        for path in server.data_dir.rglob("*")
        if path.is_file()
    }

    # The scan is not vacuous: requests were logged and metered, errors were answered.
    assert len(session.request_ids) >= 5 and len(session.error_bodies) >= 20
    logged = "\n".join(log_lines)
    assert all(rid in logged for rid in session.request_ids)
    assert any(keys[0][:17] in line for line in log_lines)  # the display prefix is fine
    assert all(rid in " ".join(columns) for rid in session.request_ids)  # ledger entries
    assert any("'audit'" in value for value in columns)  # text columns are read, as text
    assert any("invalid API key" in body for body in session.error_bodies)

    needles = [PROMPT, *(n for key in keys for n in _needles(key))]
    places: dict[str, list[str]] = {
        "log line": log_lines,
        "error body": session.error_bodies,
        "metrics": metrics.splitlines(),
        "database column": columns,
        **{f"file {path.name}": [text] for path, text in files.items()},
    }
    leaks = [
        f"{needle[:24]}… in {where}: {text[:160]!r}"
        for where, texts in places.items()
        for text in texts
        for needle in needles
        if needle in text
    ]
    assert not leaks, "\n".join(leaks[:20])
