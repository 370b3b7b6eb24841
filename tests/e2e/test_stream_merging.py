"""Every streamed token arrives exactly once and in order, with many streams and slow readers.

The engine front merges what a reader has not taken yet (its per-request slot):
when the worker's or the embedded gateway's loop is busy with many streams, a
frame or an SSE event carries the tokens of several steps. (How often that
happens here depends on the machine's load: loopback sockets buffer more than a
response, so a slow client alone does not block the server; the worker test
`tests/engine/worker/test_worker_frames.py` makes its reader late for certain.)
What must hold: each streamed
response, read fast or slowly, carries the same tokens in the same order as the
same request answered whole (greedy, `ignore_eos`, fixed length), its text is the
whole text, and its usage counts each token once. Run on the worker pool (a real
`hydrant worker` process behind the gateway) and on the embedded default.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hydrant_server import RunningServer
from worker_stack import (
    pool_env,
    pool_gateway,
    ready_workers,
    redis_prefix,
    wait_until,
    worker_processes,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

STREAMS = 20
MAX_TOKENS = 320
LOGPROBS = 5  # big events: a slow reader's socket and the server's buffers fill up
SLOW_EVERY = 4  # every fourth client reads through a small window, slowly
SLOW_START_S = 2.0  # reads nothing at first: the server's writes block once buffers fill
SLOW_READ_BYTES = 512
SLOW_READ_S = 0.01


@dataclass
class Read:
    """What one completion showed its client: its tokens (from logprobs) and its text."""

    tokens: list[str] = field(default_factory=list)
    text: str = ""
    usage: int | None = None
    done: bool = False


def body(i: int, stream: bool) -> dict[str, Any]:
    return {
        "model": "demo",
        "prompt": f"story {i}: " + "once upon a time " * (1 + i % 5),
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": LOGPROBS,
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def whole(base_url: str, key: str, i: int) -> Read:
    response = httpx.post(
        f"{base_url}/v1/completions",
        json=body(i, stream=False),
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    payload = response.json()
    choice = payload["choices"][0]
    return Read(
        tokens=choice["logprobs"]["tokens"],
        text=choice["text"],
        usage=payload["usage"]["completion_tokens"],
        done=True,
    )


def read_events(read: Read, lines: Iterable[str]) -> Read:
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            read.done = True
            continue
        event = json.loads(data)
        assert "error" not in event, event
        if event.get("usage"):
            read.usage = event["usage"]["completion_tokens"]
        for choice in event["choices"]:
            read.text += choice["text"]
            if choice["logprobs"] is not None:
                read.tokens.extend(choice["logprobs"]["tokens"])
    return read


def streamed(base_url: str, key: str, i: int) -> Read:
    """A client that reads as fast as the server writes."""
    with httpx.stream(
        "POST",
        f"{base_url}/v1/completions",
        json=body(i, stream=True),
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200, response.read()
        return read_events(Read(), response.iter_lines())


def streamed_slowly(base_url: str, key: str, i: int) -> Read:
    """A client behind a small receive window that reads nothing for a while, then a little at
    a time."""
    url = urlsplit(base_url)
    payload = json.dumps(body(i, stream=True)).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window
    sock.settimeout(120)
    received = bytearray()
    with sock:
        sock.connect((url.hostname or "127.0.0.1", url.port or 80))
        sock.sendall(head + payload)
        time.sleep(SLOW_START_S)
        while piece := sock.recv(SLOW_READ_BYTES):
            received += piece
            time.sleep(SLOW_READ_S)
    head_bytes, _, rest = bytes(received).partition(b"\r\n\r\n")
    assert head_bytes.startswith(b"HTTP/1.1 200"), head_bytes
    assert b"transfer-encoding: chunked" in head_bytes.lower()
    return read_events(Read(), dechunk(rest).decode().splitlines())


def dechunk(data: bytes) -> bytes:
    """An HTTP/1.1 chunked body's bytes."""
    out = bytearray()
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += data[:size]
        data = data[size + 2 :]


def check_every_token_once_in_order(server: RunningServer) -> None:
    _, key = server.tenant_key("merging")
    base = server.base_url
    with ThreadPoolExecutor(STREAMS) as pool:
        expected = list(pool.map(lambda i: whole(base, key, i), range(STREAMS)))
        reads = list(
            pool.map(
                lambda i: (streamed_slowly if i % SLOW_EVERY == 0 else streamed)(base, key, i),
                range(STREAMS),
            )
        )
    for i, (got, want) in enumerate(zip(reads, expected, strict=True)):
        assert got.done, i
        assert len(want.tokens) == MAX_TOKENS
        assert got.tokens == want.tokens, i  # each token once, in order
        assert got.text == want.text, i
        assert got.usage == want.usage == MAX_TOKENS, i


@pytest.fixture
def pool_server(
    demo_model_dir: Path, redis_url: str, data_dir: Path, tmp_path: Path
) -> Iterator[RunningServer]:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url,
            prefix,
            HYDRANT_POOL_SCALER="none",
            HYDRANT_POOL_START_WORKERS="0",
            HYDRANT_KV_CACHE_BYTES=str(64 * 1024 * 1024),
        )
        with (
            worker_processes(1, demo_model_dir, env, tmp_path),
            pool_gateway(data_dir, demo_model_dir, env) as server,
        ):
            wait_until(lambda: len(ready_workers(server)) == 1, 120, "a ready worker")
            yield server


def test_streams_through_a_worker_carry_every_token_once_in_order(
    pool_server: RunningServer,
) -> None:
    check_every_token_once_in_order(pool_server)


def test_streams_on_the_embedded_default_carry_every_token_once_in_order(
    server: RunningServer,
) -> None:
    check_every_token_once_in_order(server)
