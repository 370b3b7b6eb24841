"""The lean path (inference/lean_path.py) answers the generation routes as their Litestar
handlers do: the same statuses, error objects, headers and generations, whole and streamed.

Two apps on the real demo-model engine, real auth and the real ledger on SQLite, one with
the lean path and one without (`HYDRANT_LEAN_PATH=false`), get the same requests through
Litestar's ASGI test client; a third check breaks the handlers to show which path answered.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from hydrant.platform.app import LEAN_ROUTES, create_app
from hydrant.platform.db import migrate
from hydrant.platform.http.ingest import GENERATION_PATHS
from hydrant.platform.keys import generate_key
from hydrant.platform.services import build_services
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings

MAX_BODY = 64 * 1024

Api = tuple[AsyncTestClient[Litestar], str]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def _api(demo_model_dir: Path, tmp_path: Path, lean: bool) -> AsyncIterator[Api]:
    admin = generate_key("test").secret
    settings = load_settings(
        {},
        data_dir=tmp_path / ("lean" if lean else "litestar"),
        models=(ModelSpec("demo", demo_model_dir),),
        admin_bootstrap_key=admin,
        kv_cache_bytes=16 * 1024 * 1024,
        max_request_body_bytes=MAX_BODY,
        lean_path=lean,
    )
    await asyncio.to_thread(migrate.upgrade, settings.effective_database_url)
    engines = load_embedded_engines(settings)
    services = build_services(settings, registry=engines.registry)
    services.on_stop.append(engines.shutdown)
    async with AsyncTestClient(create_app(settings, services)) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        tenant = await client.post("/admin/tenants", json={"name": "t"}, headers=headers)
        key = await client.post(
            "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=headers
        )
        yield client, key.json()["secret"]


@pytest.fixture()
async def lean(demo_model_dir: Path, tmp_path: Path) -> AsyncIterator[Api]:
    async for api in _api(demo_model_dir, tmp_path, lean=True):
        yield api


@pytest.fixture()
async def litestar(demo_model_dir: Path, tmp_path: Path) -> AsyncIterator[Api]:
    async for api in _api(demo_model_dir, tmp_path, lean=False):
        yield api


PROMPT = "The river runs past the stone"
CHAT = [{"role": "user", "content": "hi"}]

# (path, body, whose key: "tenant", "none", "wrong", or raw bytes as the body)
REQUESTS: list[tuple[str, Any, str]] = [
    (
        "/v1/completions",
        {"model": "demo", "prompt": PROMPT, "max_tokens": 5, "temperature": 0},
        "tenant",
    ),
    (
        "/v1/completions",
        {
            "model": "demo",
            "prompt": [5, 6, 7],
            "max_tokens": 4,
            "stream": True,
            "logprobs": 2,
            "temperature": 0,
        },
        "tenant",
    ),
    (
        "/v1/completions",
        {
            "model": "demo",
            "prompt": PROMPT,
            "max_tokens": 3,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        "tenant",
    ),
    (
        "/v1/chat/completions",
        {"model": "demo", "messages": CHAT, "max_tokens": 4, "temperature": 0},
        "tenant",
    ),
    (
        "/v1/chat/completions",
        {"model": "demo", "messages": CHAT, "max_tokens": 4, "stream": True, "temperature": 0},
        "tenant",
    ),
    ("/v1/embeddings", {"model": "demo", "input": PROMPT}, "tenant"),
    (
        "/v1/responses",
        {"model": "demo", "input": "hi", "max_output_tokens": 4, "temperature": 0},
        "tenant",
    ),
    (
        "/v1/responses",
        {"model": "demo", "input": "hi", "max_output_tokens": 4, "stream": True, "temperature": 0},
        "tenant",
    ),
    # refusals: each the same OpenAI error object on both paths
    ("/v1/completions", {"model": "demo", "prompt": PROMPT}, "none"),
    ("/v1/chat/completions", {"model": "demo", "messages": CHAT}, "wrong"),
    ("/v1/completions", b"{not json", "tenant"),
    ("/v1/completions", b"", "tenant"),
    ("/v1/completions", {"model": "nope", "prompt": PROMPT}, "tenant"),
    ("/v1/completions", {"model": "demo", "prompt": [5, 99999]}, "tenant"),
    ("/v1/chat/completions", {"model": "demo", "messages": []}, "tenant"),
    ("/v1/embeddings", {"model": "demo", "input": ""}, "tenant"),
    ("/v1/completions", {"model": "demo", "prompt": "x" * (MAX_BODY + 1)}, "tenant"),
]

VOLATILE = {"id", "created", "created_at", "system_fingerprint", "response_id", "item_id"}


def _stable(value: Any) -> Any:
    """`value` without what differs between any two answers (ids, times)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, str) and value.startswith(("resp_", "msg_", "cmpl-", "chatcmpl-")):
        return "<id>"
    return value


def _events(text: str) -> dict[str, Any]:
    """What an SSE body says, whatever its chunking (how many tokens an event carries
    depends on timing): the text and logprob tokens per choice, the last finish reason and
    usage, the kinds of events, how it ended, and a Responses stream's final response."""
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    kinds: set[str] = set()
    summary: dict[str, Any] = {"done": False}
    for line in text.splitlines():
        if line.startswith("event: "):
            kinds.add(line)
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            summary["done"] = True
            continue
        event = json.loads(data)
        kinds.add(str(event.get("object") or event.get("type")))
        if event.get("type") == "response.completed":
            summary["response"] = _stable(event["response"])
        for choice in event.get("choices") or []:
            index = choice["index"]
            piece = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            texts[index] = texts.get(index, "") + piece
            tokens.setdefault(index, []).extend((choice.get("logprobs") or {}).get("tokens", []))
            if choice.get("finish_reason"):
                summary["finish_reason"] = choice["finish_reason"]
        if event.get("usage"):
            summary["usage"] = event["usage"]
    return {**summary, "texts": texts, "tokens": tokens, "kinds": sorted(kinds)}


async def _answer(api: Api, path: str, body: Any, who: str) -> dict[str, Any]:
    client, key = api
    headers = {"content-type": "application/json"}
    if who == "tenant":
        headers["authorization"] = f"Bearer {key}"
    elif who == "wrong":
        headers["authorization"] = f"Bearer {generate_key('test').secret}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(path, content=content, headers=headers)
    kept = {"content-type", "cache-control", "x-accel-buffering", "retry-after"}
    answer: dict[str, Any] = {
        "status": response.status_code,
        "headers": {k: v for k, v in response.headers.items() if k in kept},
        "rate_headers": sorted(k for k in response.headers if k.startswith("x-ratelimit-")),
        "request_id": response.headers.get("x-request-id", "").startswith("req_"),
    }
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        answer["events"] = _events(response.text)
    else:
        answer["body"] = _stable(response.json())
    return answer


async def test_both_paths_answer_every_request_alike(lean: Api, litestar: Api) -> None:
    for path, body, who in REQUESTS:
        got = await _answer(lean, path, body, who)
        want = await _answer(litestar, path, body, who)
        assert got == want, (path, body if not isinstance(body, bytes) else body[:20], who)
        assert got["request_id"]  # before_send's header, on the lean path's answers too
    statuses = [(await _answer(lean, path, body, who))["status"] for path, body, who in REQUESTS]
    assert statuses == [200] * 8 + [401, 401, 400, 400, 404, 400, 400, 400, 413]


async def test_the_lean_path_answers_without_the_handlers(
    lean: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the handlers' shared entry broken, every generation route still answers: the
    lean path served them; a route it leaves to Litestar (another path) meets the break."""
    from hydrant.platform.inference.chat import controllers as chat
    from hydrant.platform.inference.completions import controllers as completions
    from hydrant.platform.inference.embeddings import controllers as embeddings
    from hydrant.platform.inference.responses import controllers as responses

    async def broken(*_: Any) -> Any:
        raise RuntimeError("the handler ran")

    for module in (chat, completions, embeddings, responses):
        monkeypatch.setattr(module, "serve", broken)
    client, key = lean
    headers = {"authorization": f"Bearer {key}"}
    for path, body, _ in REQUESTS[:8]:
        response = await client.post(path, json=body, headers=headers)
        assert response.status_code == 200, (path, response.text)
    scored = await client.post(
        "/v1/score", json={"model": "demo", "text_1": "a", "text_2": "b"}, headers=headers
    )
    assert scored.status_code == 500  # /v1/score is the embeddings handler's, not lean


def test_the_lean_routes_are_the_ordered_generation_routes() -> None:
    assert set(LEAN_ROUTES) == GENERATION_PATHS
