"""A real `hydrant worker` process on the real Redis: auth, streaming, drain, heartbeat expiry,
and the gateway's link to it (`WorkerHttp`): requests sharing one step stream, two gateways,
abort, reconnect, a worker killed mid-stream."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import jsonschema
import pytest
import redis

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import AdapterRef, GenerateChunk, GenerateRequest, Sampling
from hydrant.engine.worker.wire import (
    SECRET_HEADER,
    WorkerRecord,
    pool_key,
    record_decoder,
    record_key,
)
from hydrant.platform.dispatch.directory import WorkerDirectory
from hydrant.platform.dispatch.worker_http import WorkerHttp, WorkerUnavailable

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = "worker-test-secret"


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    prefix: str
    redis_url: str
    log: Path

    def record(self) -> WorkerRecord | None:
        client = redis.Redis.from_url(self.redis_url)
        try:
            ids = client.zrange(pool_key(self.prefix, "demo"), 0, -1)
            for worker_id in ids:
                raw = client.get(record_key(self.prefix, worker_id.decode()))
                if raw is not None:
                    return record_decoder.decode(raw)
            return None
        finally:
            client.close()

    @property
    def address(self) -> str:
        record = self.record()
        assert record is not None
        return record.address


def start_worker(model_dir: Path, redis_url: str, tmp_path: Path, prefix: str) -> Worker:
    log = tmp_path / f"worker-{uuid.uuid4().hex[:6]}.log"
    env = {
        **os.environ,
        "HYDRANT_REDIS_URL": redis_url,
        "HYDRANT_WORKER_SECRET": SECRET,
        "HYDRANT_WORKER_REGISTRY_PREFIX": prefix,
        "HYDRANT_WORKER_HEARTBEAT_S": "0.5",
        "HYDRANT_WORKER_HEARTBEAT_TTL_S": "2",
        "HYDRANT_KV_CACHE_BYTES": str(16 * 1024 * 1024),
        "HYDRANT_LOG_FORMAT": "text",
        "HYDRANT_DATA_DIR": str(tmp_path),
    }
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hydrant.cli",
                "worker",
                "--model",
                "demo",
                "--path",
                str(model_dir),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    worker = Worker(process, prefix, redis_url, log)
    deadline = time.monotonic() + 90
    while True:
        record = worker.record()
        if record is not None and record.state == "ready":
            return worker
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("worker did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.2)


def _cleanup(worker: Worker) -> None:
    if worker.process.poll() is None:
        worker.process.kill()
        worker.process.wait(10)
    client = redis.Redis.from_url(worker.redis_url)
    keys = list(client.scan_iter(f"{worker.prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture()
def worker(demo_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[Worker]:
    """A worker of its own, for tests that stop it."""
    w = start_worker(demo_model_dir, redis_url, tmp_path, f"hydrant-test:{uuid.uuid4().hex}")
    try:
        yield w
    finally:
        _cleanup(w)


@pytest.fixture(scope="module")
def shared_worker(
    demo_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """One worker for the tests that leave it running (a start costs seconds of CPU)."""
    tmp = tmp_path_factory.mktemp("worker")
    w = start_worker(demo_model_dir, redis_url, tmp, f"hydrant-test:{uuid.uuid4().hex}")
    try:
        yield w
    finally:
        _cleanup(w)


STATUS = {"unauthorized": 401, "unavailable": 503}


def run(address: str, request: GenerateRequest, secret: str = SECRET) -> list[GenerateChunk]:
    """The request run as the gateway runs it: a link to the worker, an admission on it."""

    async def chunks() -> list[GenerateChunk]:
        http = WorkerHttp(secret)
        try:
            return [chunk async for chunk in http.generate(address, request)]
        finally:
            await http.aclose()

    return asyncio.run(chunks())


def generate(
    address: str, request: GenerateRequest, secret: str = SECRET
) -> tuple[int, list[GenerateChunk]]:
    """The request's chunks, and the status the worker's answer stands for."""
    try:
        return 200, run(address, request, secret)
    except WorkerUnavailable as exc:
        return STATUS[exc.reason], []
    except InvalidRequestError:
        return 400, []


def refused_param(address: str, request: GenerateRequest) -> str:
    """The parameter a worker's 400 names for a request it refuses."""
    with pytest.raises(InvalidRequestError) as refused:
        run(address, request)
    return str(refused.value.param)


def long_request(request_id: str, max_tokens: int = 300) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=list(range(10, 60)),
        sampling=Sampling(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )


def test_every_route_but_healthz_needs_the_secret(shared_worker: Worker) -> None:
    worker = shared_worker
    base = worker.address
    assert httpx.get(f"{base}/healthz").status_code == 200
    for method, path in [
        ("GET", "/stats"),
        ("GET", "/metrics"),
        ("POST", "/sleep"),
        ("POST", "/drain"),
    ]:
        assert httpx.request(method, f"{base}{path}").status_code == 401, path
        wrong = httpx.request(method, f"{base}{path}", headers={SECRET_HEADER: SECRET + "x"})
        assert wrong.status_code == 401, path
        bad_bearer = httpx.request(
            method, f"{base}{path}", headers={"Authorization": f"Bearer {SECRET}x"}
        )
        assert bad_bearer.status_code == 401, path
    status, _ = generate(base, long_request("r0", 2), secret="nope")
    assert status == 401
    stats = httpx.get(f"{base}/stats", headers={SECRET_HEADER: SECRET}).json()
    assert stats["state"] == "ready" and stats["stats"]["num_total_blocks"] > 0
    metrics = httpx.get(f"{base}/metrics", headers={SECRET_HEADER: SECRET}).text
    assert "hydrant_kv_cache_usage_perc" in metrics
    # Prometheus' PodMonitor can only send the secret as a bearer token.
    scraped = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {SECRET}"})
    assert scraped.status_code == 200 and "hydrant_kv_cache_usage_perc" in scraped.text
    assert worker.process.poll() is None  # nothing above stopped it


def test_generate_streams_chunks_and_refuses_a_bad_request_with_400(shared_worker: Worker) -> None:
    worker = shared_worker
    status, chunks = generate(worker.address, long_request("r1", 5))
    assert status == 200
    assert all(isinstance(c, GenerateChunk) for c in chunks)
    assert chunks[-1].finished and chunks[-1].usage is not None
    assert (
        chunks[-1].usage.completion_tokens == 5 == sum(len(c.choices[0].token_ids) for c in chunks)
    )
    bad = GenerateRequest(
        request_id="r2", prompt_token_ids=[1, 2], sampling=Sampling(temperature=-1)
    )
    assert refused_param(worker.address, bad) == "temperature"


def test_a_json_schema_crosses_the_wire_and_the_worker_enforces_it(
    shared_worker: Worker,
) -> None:
    schema = {
        "type": "object",
        "properties": {"verdict": {"enum": ["yes", "no"]}, "n": {"type": "integer", "maximum": 9}},
        "required": ["verdict", "n"],
        "additionalProperties": False,
    }
    text = json.dumps(schema)
    request = GenerateRequest(
        request_id="json-1",
        prompt_token_ids=list(range(10, 30)),
        sampling=Sampling(
            max_tokens=40, temperature=1.0, n=2, seed=7, structured_output=("json", text)
        ),
    )
    status, chunks = generate(shared_worker.address, request)
    assert status == 200
    for index in (0, 1):
        deltas = [c for chunk in chunks for c in chunk.choices if c.index == index]
        assert deltas[-1].finish_reason == "stop"
        jsonschema.validate(json.loads("".join(d.text for d in deltas)), schema)
    bad = GenerateRequest(
        request_id="json-2",
        prompt_token_ids=[5, 6],
        sampling=Sampling(structured_output=("json", '{"type": "nonsense"}')),
    )
    assert refused_param(shared_worker.address, bad) == "response_format"


def test_an_embedding_crosses_the_wire_whole(shared_worker: Worker) -> None:
    """One frame, finished, carrying a unit vector and no generated token; a cut the model
    was not trained for is the worker's 400."""
    prompt = list(range(10, 40))
    request = GenerateRequest(
        request_id="embed-1", prompt_token_ids=prompt, sampling=Sampling(max_tokens=0, embed=True)
    )
    status, chunks = generate(shared_worker.address, request)
    assert status == 200
    (chunk,) = chunks
    assert chunk.finished and chunk.embedding is not None and chunk.usage is not None
    assert chunk.usage.prompt_tokens == len(prompt) and chunk.usage.completion_tokens == 0
    assert abs(sum(v * v for v in chunk.embedding) - 1.0) < 1e-5
    cut = GenerateRequest(
        request_id="embed-2",
        prompt_token_ids=prompt,
        sampling=Sampling(max_tokens=0, embed=True, embed_dimensions=8),
    )
    assert refused_param(shared_worker.address, cut) == "dimensions"


def _demo_adapter(demo_model_dir: Path, out_dir: Path) -> AdapterRef:
    """A random PEFT LoRA adapter of the demo model, written by peft itself."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    config = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj", "down_proj"])
    config.init_lora_weights = False  # random B too: a delta that changes the output
    with warnings.catch_warnings():  # peft 0.21 on transformers 5: a deprecated property
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(demo_model_dir), config)
        model.save_pretrained(out_dir)
    return AdapterRef(name="tenant-lora", path=str(out_dir))


def test_an_adapter_crosses_the_wire_and_a_bad_one_is_a_400(
    shared_worker: Worker, demo_model_dir: Path, tmp_path: Path
) -> None:
    """The worker loads the adapter the request names on first use (no restart), runs it,
    lists it in its stats; an adapter it cannot serve is that request's 400 on `model`."""
    adapter = _demo_adapter(demo_model_dir, tmp_path / "tenant-lora")
    outputs = {}
    for rid, ref in (("base-1", None), ("lora-1", adapter)):
        request = GenerateRequest(
            request_id=rid,
            prompt_token_ids=list(range(40, 60)),
            sampling=Sampling(max_tokens=8, temperature=0.0, ignore_eos=True),
            adapter=ref,
        )
        status, chunks = generate(shared_worker.address, request)
        assert status == 200
        assert chunks[-1].finished and chunks[-1].choices[-1].finish_reason == "length"
        outputs[rid] = [t for c in chunks for choice in c.choices for t in choice.token_ids]
    assert len(outputs["lora-1"]) == 8 and outputs["lora-1"] != outputs["base-1"]
    stats = httpx.get(f"{shared_worker.address}/stats", headers={SECRET_HEADER: SECRET}).json()
    assert stats["stats"]["loaded_adapters"] == ["tenant-lora"]
    missing = AdapterRef(name="missing", path=str(tmp_path / "not-there"))
    bad = GenerateRequest(
        request_id="lora-2", prompt_token_ids=[1, 2], sampling=Sampling(), adapter=missing
    )
    assert refused_param(shared_worker.address, bad) == "model"


def test_unload_frees_the_engine_and_load_brings_it_back(shared_worker: Worker) -> None:
    base, auth = shared_worker.address, {SECRET_HEADER: SECRET}
    assert httpx.post(f"{base}/unload", headers=auth).json()["state"] == "unloaded"
    assert httpx.get(f"{base}/healthz").status_code == 503
    assert generate(base, long_request("u1", 2))[0] == 503  # the gateway retries elsewhere
    assert shared_worker.record().state == "unloaded"  # type: ignore[union-attr]
    loaded = httpx.post(f"{base}/load", headers=auth, json={}, timeout=120)
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready"
    status, chunks = generate(base, long_request("u2", 3))
    assert status == 200 and chunks[-1].finished
    missing = httpx.post(f"{base}/load", headers=auth, json={"path": "/nowhere"}, timeout=60)
    assert missing.status_code == 409  # a model is loaded: unload first


def test_sigterm_finishes_running_requests_then_deregisters_and_exits_0(worker: Worker) -> None:
    address = worker.address
    results: list[tuple[int, list[GenerateChunk]]] = []
    thread = threading.Thread(
        target=lambda: results.append(generate(address, long_request("long")))
    )
    thread.start()
    deadline = time.monotonic() + 30
    while httpx.get(f"{address}/stats", headers={SECRET_HEADER: SECRET}).json()["inflight"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    worker.process.send_signal(signal.SIGTERM)
    # Draining: published at once, and new work is refused (the gateway retries it elsewhere).
    deadline = time.monotonic() + 10
    while (record := worker.record()) is not None and record.state != "draining":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status, _ = generate(address, long_request("late", 2))
    assert status == 503 or worker.process.poll() is not None
    thread.join(60)
    assert worker.process.wait(60) == 0
    ((status, chunks),) = results
    assert status == 200 and chunks[-1].finished
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sum(len(c.choices[0].token_ids) for c in chunks) == 300
    assert worker.record() is None  # deregistered, not left to expire


def test_a_worker_that_stops_heartbeating_leaves_the_registry_within_its_ttl(
    worker: Worker,
) -> None:
    async def live() -> list[WorkerRecord]:
        directory = WorkerDirectory.from_url(worker.redis_url, worker.prefix)
        try:
            return await directory.workers("demo")
        finally:
            await directory.aclose()

    assert [r.state for r in asyncio.run(live())] == ["ready"]
    worker.process.send_signal(signal.SIGKILL)
    worker.process.wait(10)
    killed_at = time.monotonic()
    while asyncio.run(live()):
        assert time.monotonic() - killed_at < 6, "record outlived its 2 s TTL"
        time.sleep(0.2)
    client = redis.Redis.from_url(worker.redis_url)
    assert client.zcard(pool_key(worker.prefix, "demo")) == 0  # the index was pruned too
    client.close()


# ---- the gateway's link: one step stream per gateway and worker -----------------------------


def prompt_request(request_id: str, start: int, max_tokens: int = 60) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=list(range(start, start + 40)),
        sampling=Sampling(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )


def token_ids(chunks: list[GenerateChunk]) -> list[int]:
    return [t for chunk in chunks for t in chunk.choices[0].token_ids]


async def read(
    http: WorkerHttp, address: str, request: GenerateRequest, pause_s: float = 0.0
) -> list[GenerateChunk]:
    chunks = []
    async for chunk in http.generate(address, request):
        chunks.append(chunk)
        await asyncio.sleep(pause_s)  # a slow client: the gateway reads late
    return chunks


def test_requests_sharing_a_link_get_their_own_tokens_once_in_order_even_read_slowly(
    shared_worker: Worker,
) -> None:
    address = shared_worker.address
    requests = [prompt_request(f"s{i}", 10 + 7 * i) for i in range(3)]
    alone = [token_ids(run(address, r)) for r in requests]
    assert len({tuple(t) for t in alone}) == 3 and all(len(t) == 60 for t in alone)

    async def together() -> tuple[list[list[GenerateChunk]], int, int]:
        http = WorkerHttp(SECRET)
        try:
            pauses = (0.0, 0.05, 0.0)  # the middle one's client is slow
            results = await asyncio.gather(
                *(read(http, address, r, p) for r, p in zip(requests, pauses, strict=True))
            )
            return list(results), http.open_links(), http._steps.open_connections(address)
        finally:
            await http.aclose()

    results, links, connections = asyncio.run(together())
    assert (links, connections) == (1, 1)  # all three on one link, one connection
    for chunks, expected, request in zip(results, alone, requests, strict=True):
        assert token_ids(chunks) == expected  # as alone at temperature 0: once each, in order
        assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 60
        assert {c.request_id for c in chunks} == {request.request_id}
    assert len(results[1]) < 30  # the slow reader got what piled up merged, not 60 events


def test_two_gateways_with_the_same_request_id_on_one_worker_never_mix(
    shared_worker: Worker,
) -> None:
    address = shared_worker.address
    first, second = prompt_request("same", 10), prompt_request("same", 50)
    alone = [token_ids(run(address, first)), token_ids(run(address, second))]

    async def both() -> list[list[int]]:
        gateways = [WorkerHttp(SECRET), WorkerHttp(SECRET)]
        try:
            results = await asyncio.gather(
                read(gateways[0], address, first), read(gateways[1], address, second)
            )
            return [token_ids(chunks) for chunks in results]
        finally:
            for http in gateways:
                await http.aclose()

    assert asyncio.run(both()) == alone


def test_a_client_that_leaves_aborts_its_request_and_the_other_runs_on(
    shared_worker: Worker,
) -> None:
    address = shared_worker.address

    async def scenario() -> tuple[list[GenerateChunk], int]:
        http = WorkerHttp(SECRET)
        try:
            leaving = http.generate(address, prompt_request("leaves", 10, 300))
            staying = asyncio.ensure_future(read(http, address, prompt_request("stays", 30, 300)))
            await leaving.__anext__()
            await leaving.aclose()  # the client disconnected: the gateway aborts it
            inflight = 2
            for _ in range(300):
                inflight = (await http.call(address, "GET", "/stats"))["inflight"]
                if inflight <= 1 or staying.done():
                    break
                await asyncio.sleep(0.01)
            return await staying, inflight
        finally:
            await http.aclose()

    chunks, inflight_after_abort = asyncio.run(scenario())
    assert inflight_after_abort <= 1  # the one that left was aborted on the engine
    assert len(token_ids(chunks)) == 300 and chunks[-1].choices[0].finish_reason == "length"


def test_a_gateway_that_reconnects_gets_a_fresh_link(shared_worker: Worker) -> None:
    address = shared_worker.address

    async def scenario() -> tuple[str, str, list[int]]:
        http = WorkerHttp(SECRET)
        try:
            await read(http, address, prompt_request("one", 10, 3))
            old = http._links[address]
            await old.aclose()  # the connection is gone: the gateway forgets the link
            chunks = await read(http, address, prompt_request("two", 10, 3))
            return old.link_id, http._links[address].link_id, token_ids(chunks)
        finally:
            await http.aclose()

    old_id, new_id, tokens = asyncio.run(scenario())
    assert old_id != new_id and len(tokens) == 3


def test_a_worker_killed_mid_stream_fails_every_request_on_its_link(worker: Worker) -> None:
    address = worker.address

    async def scenario() -> tuple[list[BaseException | list[GenerateChunk]], float, int]:
        http = WorkerHttp(SECRET)
        started = [asyncio.Event(), asyncio.Event()]

        async def stream(i: int) -> list[GenerateChunk]:
            chunks = []
            async for chunk in http.generate(address, prompt_request(f"k{i}", 10 + 9 * i, 900)):
                chunks.append(chunk)
                started[i].set()
            return chunks

        try:
            tasks = [asyncio.ensure_future(stream(i)) for i in range(2)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            worker.process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
            return list(results), time.monotonic() - killed, http.open_links()
        finally:
            await http.aclose()

    results, seconds, links = asyncio.run(scenario())
    for result in results:
        assert isinstance(result, WorkerUnavailable) and result.reason == "lost", result
    assert seconds < 5  # at the connection's end, not at an idle timeout
    assert links == 0  # forgotten: the next request opens a fresh link (or finds none)
    with pytest.raises(WorkerUnavailable) as refused:
        run(address, long_request("after", 2))
    assert refused.value.reason == "connect"
