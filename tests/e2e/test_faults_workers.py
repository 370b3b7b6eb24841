"""Faults on the network between the gateway and its workers (issue #8), with real processes.

Each worker listens on its own port and advertises a `TcpProxy` in front of
it (`HYDRANT_WORKER_ADVERTISE_PORT`), so the gateway reaches it only through
the proxy while Redis heartbeats still flow: the fault is on the
gateway↔worker link alone, as a partition between two hosts would be.

- latency: 100 ms each way on every gateway↔worker byte: every request
  succeeds, every stream is whole, the ledger is exact;
- cut: connections reset mid-load and refused for a moment: a request that
  had produced no token runs on the other worker; a stream already running
  ends with an error event; a non-streamed one that had tokens is the
  documented 503 `worker_lost`; the ledger has one row per request with the
  tokens actually served;
- stall (a half-open connection: nothing reset, bytes stop): streams running
  there end with an error event within the stream idle timeout (the worker
  sends keep-alive frames, so silence means a dead link), not at a read timeout
  minutes later; unstarted requests go to the other worker.

A worker killed with SIGKILL (streamed and non-streamed requests): test_worker_pool.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hydrant_server import RunningServer, free_port
from tcp_proxy import TcpProxy
from worker_stack import (
    CHAT,
    SECRET,
    Plain,
    StreamResult,
    WorkerProcess,
    ledger_rows,
    metric,
    plain_chat,
    pool_env,
    pool_gateway,
    ready_workers,
    redis_prefix,
    stream_chat,
    wait_until,
)

from hydrant.engine.worker.wire import SECRET_HEADER

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(420)]

LATENCY_S = 0.1
STREAM_IDLE_TIMEOUT_S = 3.0  # the gateway's; the workers send keep-alives every 0.5 s


@dataclass
class ProxiedWorker:
    worker: WorkerProcess
    proxy: TcpProxy
    port: int  # where the worker really listens (the gateway sees the proxy's port)

    @property
    def direct(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inflight(self) -> int:
        stats = httpx.get(f"{self.direct}/stats", headers={SECRET_HEADER: SECRET}, timeout=10)
        return int(stats.json()["inflight"])


@dataclass
class Stack:
    server: RunningServer
    workers: list[ProxiedWorker]
    data_dir: Path

    def heal(self) -> None:
        """Back to a clean link: no latency, nothing paused or stalled, no stale connection."""
        for w in self.workers:
            w.proxy.latency_s = 0.0
            w.proxy.resume()
            w.proxy.pause()  # drops pooled connections opened under the previous fault
            w.proxy.resume()
        wait_until(lambda: all(w.inflight() == 0 for w in self.workers), 60, "idle workers")


def start_worker(model_dir: Path, env: dict[str, str], log_dir: Path) -> ProxiedWorker:
    port = free_port()
    proxy = TcpProxy("127.0.0.1", port)
    log = log_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "hydrant.cli", "worker", "--model", "demo"),
                *("--path", str(model_dir), "--port", str(port)),
            ],
            env={
                **os.environ,
                **env,
                "HYDRANT_DATA_DIR": str(log_dir),
                "HYDRANT_WORKER_ADVERTISE_PORT": str(proxy.port),
            },
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return ProxiedWorker(WorkerProcess(process, log), proxy, port)


@pytest.fixture(scope="module")
def stack(
    demo_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("worker-faults")
    data_dir = root / "data"
    data_dir.mkdir()
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="none",
            HYDRANT_POOL_START_WORKERS="0",
            HYDRANT_WORKER_KEEPALIVE_S="0.5",
            HYDRANT_WORKER_STREAM_IDLE_TIMEOUT_S=str(STREAM_IDLE_TIMEOUT_S),
        )
        workers: list[ProxiedWorker] = []
        try:
            for _ in range(2):
                workers.append(start_worker(demo_model_dir, env, root))
            with pool_gateway(data_dir, demo_model_dir, env) as server:
                wait_until(lambda: len(ready_workers(server)) == 2, 120, "two ready workers")
                advertised = {w["address"] for w in ready_workers(server)}
                assert advertised == {f"http://127.0.0.1:{w.proxy.port}" for w in workers}
                yield Stack(server, workers, data_dir)
        finally:
            for w in workers:
                w.proxy.close()
                w.worker.stop()


def prompt(i: int) -> str:
    return f"fault {i}: " + "say more " * (1 + i % 5)


SHARED = "You are a careful assistant who answers briefly. " * 12


def affine(group: str, i: int) -> str:
    """Prompts of one group share a long prefix: prefix affinity sends them all to one worker."""
    return f"Conversation {group}. {SHARED}Question {i}?"


def home_of(stack: Stack, live: list[StreamResult]) -> ProxiedWorker:
    """The worker running a group's requests, while one of its streams has output.

    Prefix affinity puts the whole group on one worker, but the other one can
    still hold a request for a moment (the previous cut's last aborts), and a
    group's streams last well under a second on the demo model: the busiest
    worker is taken at the first look that sees a stream running, instead of
    waiting for a moment when exactly one is busy, which the streams may not
    outlive (a CI run once timed out that way).
    """
    found: list[ProxiedWorker] = []

    def busy_with_output() -> bool:
        if not any(s.first_content_at is not None and not s.ended_at for s in live):
            return False
        load = [(w.inflight(), i) for i, w in enumerate(stack.workers)]
        most, index = max(load)
        found[:] = [stack.workers[index]] if most >= 1 else []
        return bool(found)

    deadline = time.monotonic() + 60
    while not busy_with_output():
        if time.monotonic() > deadline or (live and all(s.ended_at for s in live)):
            streams = [(s.first_content_at is not None, s.ended_at is not None) for s in live]
            inflight = [w.inflight() for w in stack.workers]
            raise AssertionError(
                "no worker seen running a group's streams: (has output, ended) per stream: "
                f"{streams}; in flight per worker: {inflight}"
            )
        time.sleep(0.02)
    return found[0]


def retries(server: RunningServer) -> float:
    return sum(
        metric(server, "hydrant_dispatch_retries_total", f'model="demo",reason="{reason}"')
        for reason in ("connect", "lost", "silent", "unavailable", "failed")
    )


def assert_ledger(
    data_dir: Path, tenant_id: str, streams: list[StreamResult], plains: list[Plain]
) -> None:
    """One row per request: served tokens exactly for complete ones, what ran for cut ones."""
    expected = len(streams) + len(plains)
    wait_until(lambda: len(ledger_rows(data_dir, tenant_id)) >= expected, 30, "ledger rows")
    time.sleep(0.5)  # a late duplicate would show up now
    rows = ledger_rows(data_dir, tenant_id)
    ids = [r.request_id for r in streams] + [p.request_id for p in plains]
    assert None not in ids
    assert len(set(ids)) == expected and set(rows) == set(ids), "missing or extra ledger rows"
    for s in streams:
        status, output_tokens = rows[s.request_id]  # type: ignore[index]
        if s.complete:
            assert (status, output_tokens) == ("finished", s.completion_tokens)
        else:  # cut after it streamed: what it produced is recorded (and was billed)
            assert status == "failed" and output_tokens >= max(1, s.deltas), (s, status)
    for p in plains:
        status, output_tokens = rows[p.request_id]  # type: ignore[index]
        if p.status == 200:
            assert (status, output_tokens) == ("finished", p.completion_tokens)
        else:
            assert status == "failed", (p, status)


def streamed_text(base_url: str, key: str, prompt: str, max_tokens: int) -> str:
    """The concatenated content of a greedy streamed chat (to compare with a non-streamed one)."""
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    parts: list[str] = []
    with httpx.stream(
        "POST",
        f"{base_url}{CHAT}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[len("data: ") :])
                assert "error" not in event, event
                parts += [c["delta"].get("content") or "" for c in event["choices"]]
    return "".join(parts)


def test_added_latency_keeps_every_request_whole_and_the_ledger_exact(stack: Stack) -> None:
    for w in stack.workers:
        w.proxy.latency_s = LATENCY_S
        w.proxy.pause()  # new connections from now on: through the delay line
        w.proxy.resume()
    try:
        tenant_id, key = stack.server.tenant_key(f"latency-{uuid.uuid4().hex[:6]}")
        base = stack.server.base_url
        accepted = [w.proxy.accepted for w in stack.workers]
        with ThreadPoolExecutor(8) as pool:
            streams = list(pool.map(lambda i: stream_chat(base, key, prompt(i), 24), range(16)))
            plains = list(pool.map(lambda i: plain_chat(base, key, prompt(50 + i), 12), range(8)))
        # Whole, not only complete: a greedy stream says exactly what the same request
        # answers in one piece (another tenant: these are not part of the count below).
        _, other = stack.server.tenant_key(f"latency-text-{uuid.uuid4().hex[:6]}")
        pairs = [
            (
                streamed_text(base, other, prompt(90 + i), 20),
                plain_chat(base, other, prompt(90 + i), 20, temperature=0),
            )
            for i in range(3)
        ]
    finally:
        stack.heal()

    assert all(s.complete for s in streams), [(s.status, s.error) for s in streams]
    assert all(s.completion_tokens == 24 and s.deltas > 0 for s in streams)
    assert all(p.status == 200 and p.completion_tokens == 12 for p in plains), plains
    for text, whole in pairs:
        assert whole.status == 200 and whole.text and text == whole.text
    # The fault was there: both workers were reached through the delayed proxy, and no
    # first token can come back sooner than one round trip through it.
    assert all(w.proxy.accepted > a for w, a in zip(stack.workers, accepted, strict=True))
    assert min(s.first_content_at - s.started_at for s in streams) >= 2 * LATENCY_S  # type: ignore[operator]
    assert_ledger(stack.data_dir, tenant_id, streams, plains)


def test_dropped_connections_retry_unstarted_requests_and_end_started_streams_clearly(
    stack: Stack,
) -> None:
    tenant_id, key = stack.server.tenant_key(f"drops-{uuid.uuid4().hex[:6]}")
    base = stack.server.base_url
    retried_before = retries(stack.server)
    futures = []
    sent_while_cut: list[Plain] = []
    with ThreadPoolExecutor(8) as pool:
        for cut in range(4):
            group = f"{cut}-{uuid.uuid4().hex[:4]}"  # its own prefix: its own home worker
            live: list[StreamResult] = []
            batch = [
                pool.submit(stream_chat, base, key, affine(group, i), 200, live) for i in range(4)
            ] + [pool.submit(plain_chat, base, key, affine(group, 10 + i), 200) for i in range(2)]
            futures += batch
            victim = home_of(stack, live)
            victim.proxy.pause()  # reset what runs there, refuse new connections...
            # ...and while it is cut off, more of the group: its home first, then the other.
            during = [
                pool.submit(plain_chat, base, key, affine(group, 20 + i), 4) for i in range(4)
            ]
            futures += during
            sent_while_cut += [f.result() for f in during]
            victim.proxy.resume()
            for f in batch:
                f.result()
        outcomes = [f.result() for f in futures]
    stack.heal()

    streams = [o for o in outcomes if isinstance(o, StreamResult)]
    plains = [o for o in outcomes if isinstance(o, Plain)]
    # Clients saw 200s, and the one documented 503 (a non-streamed request whose worker was
    # lost after it produced tokens): never another 5xx.
    assert all(s.status == 200 for s in streams), [(s.status, s.error) for s in streams]
    assert all(p.status == 200 or (p.status, p.code) == (503, "worker_lost") for p in plains), [
        (p.status, p.code) for p in plains
    ]
    broken = [s for s in streams if not s.complete]
    lost = [p for p in plains if p.status != 200]
    assert broken or lost, "the cuts hit no running request"
    for s in broken:  # an error event, then the stream's end
        assert s.error == "generation_failed" and s.done and s.deltas >= 1
    # Sent while a worker refused every connection: none could start there, all served.
    assert all(p.status == 200 and p.completion_tokens == 4 for p in sent_while_cut)
    assert retries(stack.server) > retried_before, "no request was retried on the other worker"
    assert_ledger(stack.data_dir, tenant_id, streams, plains)


def test_a_silent_link_ends_streams_at_the_idle_timeout_and_moves_new_work(stack: Stack) -> None:
    tenant_id, key = stack.server.tenant_key(f"stall-{uuid.uuid4().hex[:6]}")
    base = stack.server.base_url
    live: list[StreamResult] = []
    with ThreadPoolExecutor(8) as pool:
        started = [
            pool.submit(stream_chat, base, key, affine("stall", i), 600, live) for i in range(4)
        ]
        victim = home_of(stack, live)
        victim.proxy.stall()  # a partition: nothing is reset, bytes just stop
        try:
            later = [pool.submit(stream_chat, base, key, prompt(500 + i), 8) for i in range(6)]
            # Bounded well below the 120 s read timeout the gateway used to wait out.
            results = [f.result(timeout=60) for f in started + later]
        finally:
            victim.proxy.resume()
    stack.heal()

    assert all(r.status == 200 for r in results), [(r.status, r.error) for r in results]
    cut = [r for r in results if not r.complete]
    assert cut, "the stall hit no running stream"
    for r in cut:
        assert r.error == "generation_failed" and r.done and r.deltas >= 1
    assert all(r.complete for r in results[len(started) :]), "a new request did not move"
    assert_ledger(stack.data_dir, tenant_id, results, [])
