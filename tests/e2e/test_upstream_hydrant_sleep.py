"""Another `hydrant serve` as an upstream pool member, in vLLM's sleep mode (issue #25).

The upstream is a real `hydrant serve` (the embedded default: its engine in a
child process, SQLite); the gateway in front of it names it in
`HYDRANT_POOL_BACKENDS` with `HYDRANT_UPSTREAM_SLEEP`, a tenant key of the
upstream for `/v1` and an admin key for the sleep-mode calls. vLLM's CPU build
refuses `--enable-sleep-mode`, so this is the sleep mode the tests can run for
real: the same calls (`POST /sleep?level=1&mode=wait`, `POST /wake_up`,
`GET /is_sleeping`) the gateway sends a vLLM on a GPU.

What is checked: the idle pool is put to sleep (the upstream's engine child
says so, and the gateway's pool lists the member `sleeping`, kept, not
removed); the next request wakes it and gets the same answer it got before,
metered once in the gateway's ledger; the upstream's sleep-mode routes refuse
a tenant's key and a level they do not have.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hydrant_server import RunningServer, hydrant_server, wait_for
from worker_stack import metric, redis_prefix

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "Write a short poem about rivers"
IDLE_S = 3  # the gateway's idle timeout: the upstream sleeps this long after a request
NO_EOS = {"ignore_eos": True}  # the demo model's EOS comes early: 24 tokens every time


@pytest.fixture(scope="module")
def upstream(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with hydrant_server(
        tmp_path_factory.mktemp("upstream"),
        demo_model_dir,
        # its own idle scale-down off: only the gateway in front puts it to sleep here
        {"HYDRANT_POOL_IDLE_TIMEOUT_S": "0", "HYDRANT_LOG_FORMAT": "text"},
    ) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(
    upstream: RunningServer,
    demo_model_dir: Path,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    _, upstream_key = upstream.tenant_key("front-gateway")
    with redis_prefix(redis_url) as prefix:
        env = {
            "HYDRANT_REDIS_URL": redis_url,
            "HYDRANT_WORKER_REGISTRY_PREFIX": prefix,
            "HYDRANT_POOL_BACKENDS": f"demo=openai:{upstream.base_url}",
            "HYDRANT_UPSTREAM_SLEEP": "demo",
            "HYDRANT_UPSTREAM_API_KEY": upstream_key,
            "HYDRANT_UPSTREAM_CONTROL_KEY": upstream.admin_key,
            "HYDRANT_UPSTREAM_HEALTH_S": "0.5",
            "HYDRANT_POOL_IDLE_TIMEOUT_S": str(IDLE_S),
            "HYDRANT_LOG_FORMAT": "text",
        }
        with hydrant_server(tmp_path_factory.mktemp("gateway"), demo_model_dir, env) as running:
            yield running


def direct(upstream: RunningServer) -> str:
    """The upstream's own answer to the prompt, asked with a tenant key of its own."""
    _, key = upstream.tenant_key("direct")
    with openai.OpenAI(base_url=f"{upstream.base_url}/v1", api_key=key, max_retries=0) as client:
        answer = client.completions.create(
            model="demo", prompt=PROMPT, max_tokens=24, temperature=0, extra_body=NO_EOS
        )
    assert answer.usage is not None and answer.usage.completion_tokens == 24
    return answer.choices[0].text


def member_state(gateway: RunningServer) -> str | None:
    with gateway.admin() as admin:
        workers = admin.get("/admin/pools/demo").json()["workers"]
    return str(workers[0]["state"]) if len(workers) == 1 else None


def upstream_sleeping(upstream: RunningServer) -> bool:
    with upstream.admin() as admin:
        answer = admin.get("/is_sleeping")
    answer.raise_for_status()
    return bool(answer.json()["is_sleeping"])


def test_an_idle_upstream_sleeps_and_the_next_request_wakes_it_with_the_same_answer(
    gateway: RunningServer, upstream: RunningServer
) -> None:
    tenant_id, key = gateway.tenant_key("sleepy")
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0) as client:
        assert wait_for(lambda: member_state(gateway) == "ready", 30), member_state(gateway)
        first = client.completions.create(
            model="demo", prompt=PROMPT, max_tokens=24, temperature=0, extra_body=NO_EOS
        )
        assert first.usage is not None and first.usage.completion_tokens == 24
        assert first.choices[0].text == direct(upstream)  # what the upstream answers itself
        wakes_before = metric(gateway, "hydrant_pool_wakes_total")

        # Idle past the timeout: the gateway puts the upstream to sleep, and keeps it listed.
        assert wait_for(lambda: upstream_sleeping(upstream), 30), "the upstream never slept"
        assert wait_for(lambda: member_state(gateway) == "sleeping", 10), member_state(gateway)
        with upstream.admin() as admin:
            asleep = admin.get("/is_sleeping").json()
        assert asleep == {"is_sleeping": True, "models": {"demo": "sleeping"}}

        second = client.completions.create(
            model="demo", prompt=PROMPT, max_tokens=24, temperature=0, extra_body=NO_EOS
        )
    assert second.choices[0].text == first.choices[0].text
    assert second.usage == first.usage
    assert metric(gateway, "hydrant_pool_wakes_total") == wakes_before + 1
    assert not upstream_sleeping(upstream)
    assert member_state(gateway) == "ready"
    log = gateway.log_file.read_text(errors="replace")
    assert "waking pool" in log and "pool idle: scaling to zero" in log
    # the upstream streamed its token ids (vLLM's `return_token_ids`): the gateway's own
    # counts, which its `usage` agreed with
    assert "upstream usage differs" not in log
    assert wait_for(lambda: len(gateway.ledger_rows(tenant_id)) == 2, 10)
    rows = gateway.ledger_rows(tenant_id)
    ids = [first.id.removeprefix("cmpl-"), second.id.removeprefix("cmpl-")]
    assert [(r[0], r[1]) for r in rows] == [(ids[0], "finished"), (ids[1], "finished")]
    assert {(r[2], r[3]) for r in rows} == {
        (first.usage.prompt_tokens, first.usage.completion_tokens)
    }


def test_the_upstreams_sleep_routes_take_admin_keys_and_level_one_only(
    upstream: RunningServer,
) -> None:
    _, tenant_key = upstream.tenant_key("not-an-operator")
    with httpx.Client(base_url=upstream.base_url, timeout=30) as anonymous:
        for method, path in (("POST", "/sleep"), ("POST", "/wake_up"), ("GET", "/is_sleeping")):
            refused = anonymous.request(
                method, path, headers={"Authorization": f"Bearer {tenant_key}"}
            )
            assert refused.status_code in (401, 403), (path, refused.status_code)
        assert anonymous.post("/sleep").status_code == 401
    with upstream.admin() as admin:
        level_two = admin.post("/sleep", params={"level": 2})
        assert level_two.status_code == 400
        assert level_two.json()["error"]["param"] == "level"
        assert not admin.get("/is_sleeping").json()["is_sleeping"]  # nothing was put to sleep
        # and an operator's own sleep and wake, as vLLM's clients send them
        assert admin.post("/sleep", params={"level": 1, "mode": "wait"}).json()["is_sleeping"]
        woken = admin.post("/wake_up", params=[("tags", "weights"), ("tags", "kv_cache")])
        assert woken.status_code == 200
        assert woken.json() == {"is_sleeping": False, "models": {"demo": "ready"}}


def test_token_ids_and_logprobs_come_through_as_the_upstream_gives_them(
    gateway: RunningServer, upstream: RunningServer
) -> None:
    """vLLM's `return_token_ids` and `return_tokens_as_token_ids`, which the gateway asks
    of every upstream: a `hydrant serve` answers them, streamed and not."""
    _, front_key = gateway.tenant_key("logprobs")
    _, own_key = upstream.tenant_key("logprobs-direct")
    ask: dict[str, Any] = {
        "model": "demo",
        "prompt": PROMPT,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 2,
        "extra_body": NO_EOS,
    }
    with openai.OpenAI(base_url=f"{upstream.base_url}/v1", api_key=own_key) as own:
        direct = own.completions.create(**ask)
        with_ids = own.completions.create(
            **{**ask, "extra_body": {**NO_EOS, "return_token_ids": True}}
        ).choices[0]
        as_ids = {**NO_EOS, "return_token_ids": True, "return_tokens_as_token_ids": True}
        streamed = list(own.completions.create(**{**ask, "extra_body": as_ids}, stream=True))
    assert direct.usage is not None
    extra = with_ids.model_extra or {}
    assert len(extra["prompt_token_ids"]) == direct.usage.prompt_tokens
    assert len(extra["token_ids"]) == direct.usage.completion_tokens == 8
    streamed_ids = [i for c in streamed for i in (c.choices[0].model_extra or {})["token_ids"]]
    assert streamed_ids == extra["token_ids"]
    assert (streamed[0].choices[0].model_extra or {})["prompt_token_ids"] == (
        extra["prompt_token_ids"]
    )
    named = [t for c in streamed for t in (c.choices[0].logprobs.tokens or [])]  # type: ignore[union-attr]
    assert named == [f"token_id:{i}" for i in extra["token_ids"]]
    assert (direct.model_extra or {}).get("token_ids") is None  # only when asked for

    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=front_key) as front:
        through = front.completions.create(**ask)
    ours, theirs = through.choices[0].logprobs, direct.choices[0].logprobs
    assert ours is not None and theirs is not None
    assert through.choices[0].text == direct.choices[0].text
    assert ours.tokens == theirs.tokens  # rendered by the gateway from the ids
    assert ours.token_logprobs == pytest.approx(theirs.token_logprobs, abs=1e-5)
    assert ours.text_offset == theirs.text_offset
    assert [sorted(t or {}) for t in ours.top_logprobs or []] == [
        sorted(t or {}) for t in theirs.top_logprobs or []
    ]
