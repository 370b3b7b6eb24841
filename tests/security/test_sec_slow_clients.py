"""Slow and oversized clients against a real `hydrant serve`: bounded, and the server keeps serving.

Raw sockets, because an HTTP client library will not send half a request:
a client that sends its headers and then stalls (or trickles) the body gets a
408 within the configured time; oversized headers and bodies are refused; an
idle keep-alive connection is closed. Meanwhile other clients are served.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server
from slow_client import dribble

pytestmark = pytest.mark.slow

BODY_TIMEOUT_S = 2
HEADER_TIMEOUT_S = 2
KEEP_ALIVE_S = 1
MAX_HEADER = 8192


@pytest.fixture(scope="module")
def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    env = {
        "HYDRANT_BODY_READ_TIMEOUT_S": str(BODY_TIMEOUT_S),
        "HYDRANT_HEADER_READ_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        # uvicorn's own idle timer: any byte resets it, so it cannot stop a dribbler.
        "HYDRANT_KEEP_ALIVE_TIMEOUT_S": str(KEEP_ALIVE_S),
        "HYDRANT_MAX_HEADER_BYTES": str(MAX_HEADER),
        "HYDRANT_MAX_REQUEST_BODY_BYTES": str(64 * 1024),
    }
    with hydrant_server(tmp_path_factory.mktemp("slow"), demo_model_dir, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def key(server: RunningServer) -> str:
    return server.tenant_key("slow-client")[1]


def _connect(server: RunningServer) -> socket.socket:
    parts = urlsplit(server.base_url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=15)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pytest.fail(f"the server kept the connection open for {limit_s} s; got {data[:200]!r}")
    except ConnectionResetError:
        pass
    return data, time.monotonic() - start


def _head(key: str, length: int) -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


def _healthy(server: RunningServer) -> None:
    assert httpx.get(f"{server.base_url}/healthz", timeout=5).status_code == 200


def test_a_stalled_body_gets_408_and_others_are_served(server: RunningServer, key: str) -> None:
    with _connect(server) as stalled:
        stalled.sendall(_head(key, 1000) + b'{"model": "demo", ')
        _healthy(server)  # served while that one stalls
        data, _ = _read_until_closed(stalled, limit_s=BODY_TIMEOUT_S + 10)
    assert data.startswith(b"HTTP/1.1 408"), data[:300]
    body = json.loads(data.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_timeout"
    _healthy(server)


def test_a_trickled_body_is_bounded_too(server: RunningServer, key: str) -> None:
    """A byte now and then never lets a per-read timeout fire; the body has one deadline."""
    with _connect(server) as trickler:
        trickler.sendall(_head(key, 10_000))
        trickler.settimeout(0.5)
        start, data = time.monotonic(), b""
        while time.monotonic() - start < BODY_TIMEOUT_S + 10:
            try:
                trickler.sendall(b" ")
                data += trickler.recv(65536)
                if data:
                    break
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
        assert data.startswith(b"HTTP/1.1 408"), data[:300]
    _healthy(server)


def test_oversized_headers_are_refused(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Big: "
            + b"a" * (MAX_HEADER + 100)
            + b"\r\n\r\n"
        )
        data, _ = _read_until_closed(sock, limit_s=10)
    status = int(data.split(b" ", 2)[1])
    assert status in (400, 431), data[:300]
    # Under the limit is fine; the limit counts all headers together.
    ok = httpx.get(f"{server.base_url}/healthz", headers={"x-big": "a" * 2000}, timeout=5)
    assert ok.status_code == 200
    many = {f"x-h{i}": "a" * 400 for i in range(24)}  # ~10 KB in many small headers
    refused = httpx.get(f"{server.base_url}/healthz", headers=many, timeout=5)
    assert refused.status_code in (400, 431)
    _healthy(server)


def test_an_oversized_body_is_413(server: RunningServer, key: str) -> None:
    body = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "x" * 70_000}]})
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=10,
    )
    assert response.status_code == 413
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_an_idle_keep_alive_connection_is_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        data, _ = _read_until_closed(sock, limit_s=KEEP_ALIVE_S + 10)
    assert data.startswith(b"HTTP/1.1 200"), data[:200]


def test_dribbled_headers_are_cut_off_and_others_are_served(server: RunningServer) -> None:
    """Slowloris: a header line now and then resets uvicorn's idle timer, not the deadline."""
    with _connect(server) as slow:
        _healthy(server)
        dribble(slow, b"GET /healthz HTTP/1.1\r\nHost: test\r\n", HEADER_TIMEOUT_S + 10)
    _healthy(server)


def test_the_header_deadline_applies_to_the_next_request_on_a_connection(
    server: RunningServer,
) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        dribble(sock, b"GET /healthz HTTP/1.1\r\n", HEADER_TIMEOUT_S + 10)
