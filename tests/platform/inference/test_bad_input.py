"""Bad input on /v1 is always a 4xx in OpenAI's error shape, never a 500, and costs no engine work.

The app runs in-process with the real demo-model engine, real auth and the
real ledger on SQLite; requests go through Litestar's ASGI test client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from litestar import Litestar
from litestar.testing import AsyncTestClient

from hydrant.platform.app import create_app
from hydrant.platform.db import migrate
from hydrant.platform.keys import generate_key
from hydrant.platform.services import build_services
from hydrant.runtime import load_embedded_engines
from hydrant.settings import ModelSpec, load_settings


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# One app for the module (loading the engine for each of the ~80 cases was most of their
# time): every case runs against an app that has already refused the ones before it.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def api(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[AsyncTestClient[Litestar], str]]:
    admin = generate_key("test").secret
    settings = load_settings(
        {},
        data_dir=tmp_path_factory.mktemp("bad-input"),
        models=(ModelSpec("demo", demo_model_dir),),
        admin_bootstrap_key=admin,
        kv_cache_bytes=16 * 1024 * 1024,
        max_request_body_bytes=64 * 1024,
    )

    await asyncio.to_thread(migrate.upgrade, settings.effective_database_url)
    engines = load_embedded_engines(settings)
    services = build_services(settings, registry=engines.registry)
    services.on_stop.append(engines.shutdown)  # on the app's own loop, as `hydrant serve` does
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        headers = {"Authorization": f"Bearer {admin}"}
        tenant = await client.post("/admin/tenants", json={"name": "t"}, headers=headers)
        key = await client.post(
            "/admin/keys", json={"tenant_id": tenant.json()["id"]}, headers=headers
        )
        yield client, key.json()["secret"]


def _is_openai_error(body: Any) -> bool:
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)


def _tool(name: str, parameters: Any = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def _called(role: str, arguments: str) -> dict[str, Any]:
    """A message carrying one tool call."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": role, "content": None, "tool_calls": [call]}


CHAT = "/v1/chat/completions"
GOOD = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({**GOOD, "max_tokens": "many"}).encode(), 400, "max_tokens"),
        (json.dumps({**GOOD, "messages": "hi"}).encode(), 400, "messages"),
        (json.dumps({"messages": GOOD["messages"]}).encode(), 400, "model"),  # missing
        (json.dumps({**GOOD, "messages": []}).encode(), 400, "messages"),
        (json.dumps({**GOOD, "model": "gpt-17"}).encode(), 404, "model"),
        (json.dumps({**GOOD, "max_tokens": 10**9}).encode(), 400, "max_tokens"),
        (json.dumps({**GOOD, "max_tokens": 0}).encode(), 400, "max_tokens"),
        (json.dumps({**GOOD, "n": 0}).encode(), 400, "n"),
        (json.dumps({**GOOD, "temperature": -1}).encode(), 400, "temperature"),
        (json.dumps({**GOOD, "top_p": 7}).encode(), 400, "top_p"),
        (json.dumps({**GOOD, "top_logprobs": 3}).encode(), 400, "top_logprobs"),
        (
            json.dumps({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}).encode(),
            400,
            "messages[0].role",
        ),
        (json.dumps({**GOOD, "stop": ["a", "b", "c", "d", "e"]}).encode(), 400, "stop"),
        (json.dumps({**GOOD, "logit_bias": {"abc": 1}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "logit_bias": {"-5": 1}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "logit_bias": {"5": 100.5}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "logit_bias": {"5": "up"}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "logit_bias": {"5": 1, "005": 2}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "logit_bias": {"2048": 1}}).encode(), 400, "logit_bias"),
        (json.dumps({**GOOD, "response_format": {"type": "xml"}}).encode(), 400, "response_format"),
        (
            json.dumps({**GOOD, "response_format": {"type": "json_schema"}}).encode(),
            400,
            "response_format",
        ),
        (
            json.dumps(
                {
                    **GOOD,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
                    },
                }
            ).encode(),
            400,
            "response_format",
        ),
        (
            json.dumps(
                {
                    **GOOD,
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "not a name", "schema": {}},
                    },
                }
            ).encode(),
            400,
            "response_format",
        ),
        (
            json.dumps(
                {**GOOD, "response_format": {"type": "json_object"}, "ignore_eos": True}
            ).encode(),
            400,
            "ignore_eos",
        ),
        (
            b'{"model": "demo", "messages": [{"role": "user", "content": "hi"}], '
            b'"logit_bias": {"5": 1e999}}',
            400,
            "logit_bias",
        ),
        (
            json.dumps({**GOOD, "chat_template_kwargs": {"add_generation_prompt": False}}).encode(),
            400,
            "chat_template_kwargs",
        ),
        (json.dumps({**GOOD, "chat_template_kwargs": "x"}).encode(), 400, "chat_template_kwargs"),
        (json.dumps({**GOOD, "tools": []}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tools": [{"type": "retrieval"}]}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tools": [_tool("no spaces allowed")]}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tools": [_tool("f"), _tool("f")]}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tools": [_tool("f", {"type": "nonsense"})]}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tools": [_tool("f", [1])]}).encode(), 400, "tools"),
        (json.dumps({**GOOD, "tool_choice": "required"}).encode(), 400, "tool_choice"),
        (
            json.dumps({**GOOD, "tools": [_tool("f")], "tool_choice": "any"}).encode(),
            400,
            "tool_choice",
        ),
        (
            json.dumps({**GOOD, "tools": [_tool("f")], "tool_choice": 5}).encode(),
            400,
            "tool_choice",
        ),
        (
            json.dumps(
                {
                    **GOOD,
                    "tools": [_tool("f")],
                    "tool_choice": {"type": "function", "function": {"name": "g"}},
                }
            ).encode(),
            400,
            "tool_choice",
        ),
        (
            json.dumps(
                {
                    **GOOD,
                    "tools": [_tool("f")],
                    "tool_choice": "required",
                    "response_format": {"type": "json_object"},
                }
            ).encode(),
            400,
            "tool_choice",
        ),
        (
            json.dumps({**GOOD, "messages": [{"role": "tool", "content": "42"}]}).encode(),
            400,
            "messages[0].tool_call_id",
        ),
        (
            json.dumps({**GOOD, "messages": [_called("user", "{}")]}).encode(),
            400,
            "messages[0].tool_calls",
        ),
        (
            json.dumps({**GOOD, "messages": [_called("assistant", "{not json")]}).encode(),
            400,
            "messages[0].tool_calls",
        ),
        (b'{"model": "demo", "messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
        (
            json.dumps(
                {**GOOD, "messages": [{"role": "user", "content": "word " * 3000}]}
            ).encode(),
            422,
            "messages",
        ),
        (b"x" * (65 * 1024), 413, None),
        (json.dumps({**GOOD, "truncate_prompt_tokens": 0}).encode(), 400, "truncate_prompt_tokens"),
        (
            json.dumps({**GOOD, "truncate_prompt_tokens": 10**6}).encode(),
            400,
            "truncate_prompt_tokens",
        ),
    ],
)
async def test_bad_chat_requests(
    api: tuple[AsyncTestClient[Litestar], str], body: bytes, status: int, param: str | None
) -> None:
    client, key = api
    response = await client.post(
        CHAT,
        content=body,
        headers={"Authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    assert response.status_code == status, response.text
    payload = response.json()
    assert _is_openai_error(payload), payload
    if param is not None:
        assert payload["error"]["param"] == param
    assert response.headers["x-request-id"].startswith("req_")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "demo", "prompt": ""}, "prompt"),
        ({"model": "demo", "prompt": [999999]}, "prompt"),
        ({"model": "demo", "prompt": [-1]}, "prompt"),
        ({"model": "demo", "prompt": ["a", [1, 2]]}, "prompt"),  # a batch mixing forms
        ({"model": "demo", "prompt": ["a", ""]}, "prompt"),
        ({"model": "demo", "prompt": [[1, 2], []]}, "prompt"),
        ({"model": "demo", "prompt": [[5, 999999]]}, "prompt"),
        ({"model": "demo", "prompt": []}, "prompt"),
        ({"model": "demo", "prompt": ["a"] * 129}, "prompt"),
        ({"model": "demo", "prompt": ["a"] * 17, "n": 16}, "n"),
        ({"model": "demo", "prompt": "x", "logprobs": 9}, "logprobs"),
        ({"model": "demo", "prompt": "x", "suffix": "y"}, "suffix"),
        ({"model": "demo", "prompt": "x", "logit_bias": {"1": -101}}, "logit_bias"),
        ({"model": "demo", "prompt": "x", "response_format": {"type": "yaml"}}, "response_format"),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"xml": "a"}},
            "structured_outputs",
        ),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
        ),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"choice": "a"}},
            "structured_outputs",
        ),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"regex": "(a"}},
            "structured_outputs",
        ),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"json": "{x"}},
            "structured_outputs",
        ),
        (
            {"model": "demo", "prompt": "x", "structured_outputs": {"grammar": "start: nope"}},
            "structured_outputs",
        ),
        (
            {
                "model": "demo",
                "prompt": "x",
                "structured_outputs": {"regex": "a+"},
                "response_format": {"type": "json_object"},
            },
            "structured_outputs",
        ),
        (
            {
                "model": "demo",
                "prompt": ["x", "y"],
                "response_format": {"type": "json_schema", "json_schema": {"schema": []}},
            },
            "response_format",
        ),
        ({"model": "demo", "prompt": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        (
            {"model": "demo", "prompt": "x", "truncate_prompt_tokens": 10**6},
            "truncate_prompt_tokens",
        ),
    ],
)
async def test_bad_completion_requests(
    api: tuple[AsyncTestClient[Litestar], str], body: dict[str, Any], param: str
) -> None:
    client, key = api
    response = await client.post(
        "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_good_request_still_served_after_bad_ones(
    api: tuple[AsyncTestClient[Litestar], str],
) -> None:
    client, key = api
    headers = {"Authorization": f"Bearer {key}"}
    await client.post(CHAT, content=b"{", headers=headers)
    response = await client.post(CHAT, json=GOOD, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


async def test_anonymous_and_admin_keys_cannot_infer(
    api: tuple[AsyncTestClient[Litestar], str],
) -> None:
    client, _ = api
    anonymous = await client.post(CHAT, json=GOOD)
    assert anonymous.status_code == 401
    assert _is_openai_error(anonymous.json())


async def test_bos_flood_is_refused(api: tuple[AsyncTestClient[Litestar], str]) -> None:
    client, key = api
    flood = {**GOOD, "messages": [{"role": "user", "content": "<|begin_of_text|>" * 200}]}
    response = await client.post(CHAT, json=flood, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "abusive_prompt"


async def test_bos_flood_in_any_prompt_of_a_batch_is_refused(
    api: tuple[AsyncTestClient[Litestar], str],
) -> None:
    client, key = api
    batch = {"model": "demo", "prompt": ["a fine prompt", "<|begin_of_text|>" * 200]}
    response = await client.post(
        "/v1/completions", json=batch, headers={"Authorization": f"Bearer {key}"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "abusive_prompt"
    assert response.json()["error"]["param"] == "prompt"  # the field that holds it


async def test_a_completion_prompt_too_long_names_the_prompt(
    api: tuple[AsyncTestClient[Litestar], str],
) -> None:
    client, key = api
    for prompt in ("word " * 3000, ["short", "word " * 3000]):
        response = await client.post(
            "/v1/completions",
            json={"model": "demo", "prompt": prompt, "max_tokens": 2},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("prompt", "context_length_exceeded")


async def test_truncate_prompt_tokens_keeps_the_prompts_end(
    api: tuple[AsyncTestClient[Litestar], str], demo_model_dir: Path
) -> None:
    """vLLM's remedy for the error above: the prompt keeps its last k tokens, so a
    truncated prompt answers exactly as its tail sent alone (greedy), and only the kept
    tokens are counted."""
    from hydrant.engine.tokenizer import Tokenizer

    client, key = api
    headers = {"Authorization": f"Bearer {key}"}
    text = " ".join(f"river {i}" for i in range(1500))  # no two stretches alike
    ids = Tokenizer.from_pretrained(demo_model_dir).encode(text)
    keep = 40
    base = {"model": "demo", "max_tokens": 6, "temperature": 0, "echo": True}
    cut = await client.post(
        "/v1/completions",
        json={**base, "prompt": text, "truncate_prompt_tokens": keep},
        headers=headers,
    )
    tail = await client.post(
        "/v1/completions", json={**base, "prompt": ids[-keep:]}, headers=headers
    )
    assert cut.status_code == tail.status_code == 200, (cut.text, tail.text)
    assert cut.json()["usage"]["prompt_tokens"] == keep
    assert cut.json()["choices"][0]["text"] == tail.json()["choices"][0]["text"]
    # -1 is the whole context: a prompt that fills it leaves no room to generate.
    full = await client.post(
        "/v1/completions",
        json={**base, "prompt": ids, "truncate_prompt_tokens": -1},
        headers=headers,
    )
    assert full.status_code == 422 and full.json()["error"]["code"] == "context_length_exceeded"
    # A chat keeps its rendered conversation's last tokens too.
    chat = await client.post(CHAT, json={**GOOD, "truncate_prompt_tokens": 3}, headers=headers)
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["prompt_tokens"] == 3
