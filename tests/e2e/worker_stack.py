"""Real worker processes and a gateway that dispatches to them, for the worker-pool e2e tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis
from hydrant_server import RunningServer, hydrant_server

from hydrant.engine.worker.wire import SECRET_HEADER, pool_key, record_decoder, record_key

SECRET = "e2e-worker-secret"
CHAT = "/v1/chat/completions"


def pool_env(redis_url: str, prefix: str, **extra: str) -> dict[str, str]:
    """Settings shared by a gateway in pool mode and the workers of one test."""
    return {
        "HYDRANT_REDIS_URL": redis_url,
        "HYDRANT_WORKER_POOLS": "true",
        "HYDRANT_WORKER_SECRET": SECRET,
        "HYDRANT_WORKER_REGISTRY_PREFIX": prefix,
        "HYDRANT_WORKER_HEARTBEAT_S": "0.5",
        "HYDRANT_WORKER_HEARTBEAT_TTL_S": "2",
        "HYDRANT_KV_CACHE_BYTES": str(16 * 1024 * 1024),
        "HYDRANT_LOG_FORMAT": "text",
        **extra,
    }


@contextmanager
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A fresh registry prefix; its keys are deleted afterwards."""
    prefix = f"hydrant-test:{uuid.uuid4().hex}"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log: Path

    def address(self, redis_url: str, prefix: str) -> str | None:
        client = redis.Redis.from_url(redis_url)
        try:
            for worker_id in client.zrange(pool_key(prefix, "demo"), 0, -1):
                raw = client.get(record_key(prefix, worker_id.decode()))
                if raw is not None:
                    record = record_decoder.decode(raw)
                    if record.pid == self.process.pid:
                        return record.address
        finally:
            client.close()
        return None

    def prompt_tokens(self, redis_url: str, prefix: str) -> float:
        """Prompt tokens this worker's engine processed (from its /metrics)."""
        return self._counter(redis_url, prefix, "hydrant_prompt_tokens_total")

    def generated_tokens(self, redis_url: str, prefix: str) -> float:
        """Tokens this worker's engine generated, counted at each step (from its /metrics)."""
        return self._counter(redis_url, prefix, "hydrant_generation_tokens_total")

    def _counter(self, redis_url: str, prefix: str, name: str) -> float:
        address = self.address(redis_url, prefix)
        assert address is not None
        text = httpx.get(f"{address}/metrics", headers={SECRET_HEADER: SECRET}).text
        for line in text.splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def worker_processes(
    count: int, model_dir: Path, env: dict[str, str], log_dir: Path
) -> Iterator[list[WorkerProcess]]:
    workers: list[WorkerProcess] = []
    try:
        for _ in range(count):
            log = log_dir / f"worker-{uuid.uuid4().hex[:6]}.log"
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
                    env={**os.environ, **env, "HYDRANT_DATA_DIR": str(log_dir)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            workers.append(WorkerProcess(process, log))
        yield workers
    finally:
        for worker in workers:
            worker.stop()


@contextmanager
def pool_gateway(data_dir: Path, model_dir: Path, env: dict[str, str]) -> Iterator[RunningServer]:
    with hydrant_server(data_dir, model_dir, env=env, timeout_s=120) as server:
        yield server


def pools(server: RunningServer) -> dict[str, Any]:
    with server.admin() as admin:
        response = admin.get("/admin/pools/demo")
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def ready_workers(server: RunningServer) -> list[dict[str, Any]]:
    return [w for w in pools(server)["workers"] if w["state"] == "ready" and not w["retired"]]


def metrics_lines(server: RunningServer) -> list[str]:
    """The gateway's `/metrics` scrape, line by line."""
    return httpx.get(f"{server.base_url}/metrics", timeout=10).text.splitlines()


def metric(server: RunningServer, name: str, labels: str = 'model="demo"') -> float:
    for line in metrics_lines(server):
        if line.startswith(f"{name}{{{labels}") or line.startswith(f"{name}{{{labels},"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def retry_lines(server: RunningServer) -> list[str]:
    """The gateway's dispatch retries, by reason (what a failure message should show)."""
    return [
        line for line in metrics_lines(server) if line.startswith("hydrant_dispatch_retries_total")
    ]


@dataclass
class StreamResult:
    """What one streamed request showed its client."""

    status: int
    request_id: str | None = None
    deltas: int = 0  # events with content
    completion_tokens: int | None = None  # from the usage chunk (a complete response)
    error: str | None = None
    done: bool = False
    started_at: float = 0.0
    first_content_at: float | None = None
    ended_at: float = 0.0

    @property
    def complete(self) -> bool:
        return (
            self.status == 200
            and self.done
            and self.error is None
            and self.completion_tokens is not None
        )


def stream_chat(
    base_url: str, key: str, prompt: str, max_tokens: int, live: list[StreamResult] | None = None
) -> StreamResult:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = StreamResult(status=0, started_at=time.monotonic())
    if live is not None:
        live.append(result)
    with httpx.stream(
        "POST",
        f"{base_url}{CHAT}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as response:
        result.status = response.status_code
        result.request_id = response.headers.get("x-request-id")
        if response.status_code != 200:
            response.read()
            result.error = response.text
            result.ended_at = time.monotonic()
            return result
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                result.done = True
                continue
            event = json.loads(data)
            if "error" in event:
                result.error = event["error"]["code"]
                continue
            if event.get("usage"):
                result.completion_tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                if choice.get("delta", {}).get("content"):
                    result.deltas += 1
                    if result.first_content_at is None:
                        result.first_content_at = time.monotonic()
    result.ended_at = time.monotonic()
    return result


@dataclass
class Plain:
    """What one non-streamed request showed its client."""

    status: int
    request_id: str | None
    completion_tokens: int | None = None
    code: str | None = None  # the error's code when not 200
    text: str | None = None


def plain_chat(base_url: str, key: str, prompt: str, max_tokens: int, **sampling: Any) -> Plain:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **sampling,
    }
    response = httpx.post(
        f"{base_url}{CHAT}", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
    )
    payload: dict[str, Any] = response.json()
    request_id = response.headers.get("x-request-id")
    if response.status_code != 200:
        return Plain(response.status_code, request_id, code=payload["error"]["code"])
    return Plain(
        200,
        request_id,
        completion_tokens=payload["usage"]["completion_tokens"],
        text=payload["choices"][0]["message"]["content"],
    )


@dataclass
class Load:
    """Client threads sending requests until stopped; every result is kept."""

    send: Callable[[int], Any]
    threads: int
    results: list[Any] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: int = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                self._seq += 1
                n = self._seq
            outcome = self.send(n)
            with self._lock:
                self.results.append(outcome)

    def __enter__(self) -> Load:
        for _ in range(self.threads):
            thread = threading.Thread(target=self._run, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def ledger_rows(data_dir: Path, tenant_id: str) -> dict[str, tuple[str, int]]:
    """request id → (status, output tokens) of the tenant's ledger entries (the SQLite file)."""
    import sqlite3

    with sqlite3.connect(data_dir / "hydrant.db") as db:
        rows = db.execute(
            "SELECT request_id, status, output_tokens FROM ledger_entries WHERE tenant_id = ?",
            (tenant_id,),
        ).fetchall()
    return {r[0]: (r[1], int(r[2])) for r in rows}
