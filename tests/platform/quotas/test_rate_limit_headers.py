"""OpenAI's `x-ratelimit-*` headers: their formats, and what the official client reads.

The API test runs the real app in-process (demo engine, SQLite, real auth) with the
in-memory limiter and with real Redis, and reads the headers through the `openai`
client's `with_raw_response`, as a client built for OpenAI does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from litestar.testing import AsyncTestClient

from hydrant.platform.app import create_app
from hydrant.platform.db import migrate
from hydrant.platform.keys import generate_key
from hydrant.platform.quotas import WindowState
from hydrant.platform.quotas.rate_headers import go_duration, rate_limit_headers
from hydrant.platform.services import build_services
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),  # a wait is never written shorter than it is
        (0.02, "20ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.999, "59.999s"),
        (360, "6m0s"),
        (3723.25, "1h2m3.25s"),
    ],
)
def test_durations_read_as_openai_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def test_requests_prefer_the_tenant_rate_and_a_refusal_reads_zero() -> None:
    windows = [
        WindowState("key_rate", 10, 9, 1.0),
        WindowState("tenant_rpm", 60, 1, 12.5),
        WindowState("tenant_tpm", 1000, 800, 30.0),
    ]
    assert rate_limit_headers(windows) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "1",
        "x-ratelimit-reset-requests": "12.5s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "800",
        "x-ratelimit-reset-tokens": "30s",
    }
    refused = rate_limit_headers(windows, "tenant_tpm", 2.0)
    assert (refused["x-ratelimit-remaining-tokens"], refused["x-ratelimit-reset-tokens"]) == (
        "0",
        "2s",
    )
    only_key = rate_limit_headers([windows[0]])
    assert only_key["x-ratelimit-limit-requests"] == "10"
    assert "x-ratelimit-limit-tokens" not in only_key
    assert rate_limit_headers([]) == {}


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def openai_client(
    request: pytest.FixtureRequest, demo_model_dir: Path, tmp_path: Path
) -> AsyncIterator[openai.AsyncOpenAI]:
    """An `openai` client with a key of a tenant whose plan allows 3 requests a minute."""
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
        **overrides,  # type: ignore[arg-type]
    )
    await asyncio.to_thread(migrate.upgrade, settings.effective_database_url)
    engines = load_embedded_engines(settings)
    services = build_services(settings, registry=engines.registry)
    services.on_stop.append(engines.shutdown)
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        plan = {"name": "three", "requests_per_minute": 3, "tokens_per_minute": 100_000}
        created = await client.post("/admin/plans", json=plan, headers=headers)
        assert created.status_code == 201, created.text
        tenant = await client.post(
            "/admin/tenants", json={"name": "t", "plan": "three"}, headers=headers
        )
        assert tenant.status_code == 201, tenant.text
        key = await client.post(
            "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=headers
        )
        secret = key.json()["secret"]
        # Not closed by us: it shares the test client, which closes with its own block.
        yield openai.AsyncOpenAI(
            base_url=f"{str(client.base_url).rstrip('/')}/v1",
            api_key=secret,
            http_client=client,
            max_retries=0,
        )


MESSAGES = [{"role": "user", "content": "hi"}]


async def test_remaining_drops_by_one_and_a_429_agrees_with_retry_after(
    openai_client: openai.AsyncOpenAI,
) -> None:
    seen = []
    for _ in range(2):
        raw = await openai_client.chat.completions.with_raw_response.create(
            model="demo",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
        )
        seen.append(raw.headers)
    async with openai_client.chat.completions.with_streaming_response.create(
        model="demo",
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=2,
        stream=True,
    ) as streamed:
        seen.append(streamed.headers)
        async for _ in streamed.iter_lines():
            pass
    assert [h["x-ratelimit-limit-requests"] for h in seen] == ["3"] * 3
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
    assert all(h["x-ratelimit-limit-tokens"] == "100000" for h in seen)
    tokens_left = [int(h["x-ratelimit-remaining-tokens"]) for h in seen]
    assert tokens_left == sorted(tokens_left, reverse=True) and tokens_left[-1] < 100_000
    first_reset = seen[0]["x-ratelimit-reset-requests"]
    assert first_reset.endswith("s") and not first_reset.endswith("ms")  # about a minute

    with pytest.raises(openai.RateLimitError) as info:
        await openai_client.chat.completions.create(
            model="demo",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
        )
    refused = info.value.response.headers
    assert info.value.code == "tenant_rpm"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    reset = refused["x-ratelimit-reset-requests"]
    assert reset[-1] == "s" and "m" not in reset, reset  # under a minute: seconds only
    seconds = float(reset[:-1])
    assert 50 < seconds <= 60
    assert int(refused["retry-after"]) == math.ceil(seconds)


async def test_every_inference_surface_carries_the_headers(
    openai_client: openai.AsyncOpenAI,
) -> None:
    """Completions, embeddings and the Responses API answer through the same serving path as
    chat: each carries the six headers of its own admission (remaining 2, 1, 0)."""
    completion = await openai_client.completions.with_raw_response.create(
        model="demo", prompt="hi", max_tokens=2
    )
    embedding = await openai_client.embeddings.with_raw_response.create(model="demo", input="hi")
    response = await openai_client.responses.with_raw_response.create(
        model="demo", input="hi", max_output_tokens=2
    )
    seen = [completion.headers, embedding.headers, response.headers]
    for suffix in ("requests", "tokens"):
        for part in ("limit", "remaining", "reset"):
            assert all(f"x-ratelimit-{part}-{suffix}" in h for h in seen), (part, suffix)
    assert [h["x-ratelimit-remaining-requests"] for h in seen] == ["2", "1", "0"]
