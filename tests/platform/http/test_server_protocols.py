"""Both server protocols (httptools and the h11 fallback) against a real uvicorn, over raw sockets.

Raw sockets, because an HTTP client library will not dribble a head, send an
unfinished one or pipeline requests. Each test runs under both protocol
classes: the deadline closes only a connection waiting for a head, and a head
that grows past the bound is refused (h11 answers 400, httptools 431).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
import uvicorn
from slow_client import dribble
from uvicorn._types import ASGIReceiveCallable as Receive
from uvicorn._types import ASGISendCallable as Send
from uvicorn._types import HTTPScope as Scope

from hydrant.platform.http.server_protocol import (
    header_deadline_protocol,
    httptools_header_protocol,
    server_options,
)
from hydrant.settings import Settings

HEADER_TIMEOUT_S = 1.0
MAX_HEAD = 4096
SETTINGS = replace(
    Settings(),
    header_read_timeout_s=HEADER_TIMEOUT_S,
    max_header_bytes=MAX_HEAD,
    keep_alive_timeout_s=30,  # longer than any test: the header deadline is what closes
)
PROTOCOLS = {
    "httptools": httptools_header_protocol(HEADER_TIMEOUT_S, MAX_HEAD),
    "h11": header_deadline_protocol(HEADER_TIMEOUT_S),
}


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers `METHOD PATH BODY-LENGTH`; `/sleep` first waits longer than the header deadline."""
    body = b""
    while True:
        message = await receive()
        assert message["type"] == "http.request"
        body += message.get("body", b"")
        if not message.get("more_body", False):
            break
    if scope["path"] == "/sleep":
        await asyncio.sleep(HEADER_TIMEOUT_S * 1.5)
    if scope["path"] == "/client":  # the source address the app sees
        body = str(scope["client"][0]).encode()  # type: ignore[index]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})
        return
    payload = f"{scope['method']} {scope['path']} {len(body)}".encode()
    headers = [(b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture(scope="module", params=sorted(PROTOCOLS))
def server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    """(protocol name, port) of a uvicorn running `server_options` with that protocol."""
    options = {**server_options(SETTINGS), "http": PROTOCOLS[request.param]}
    config = uvicorn.Config(_app, host="127.0.0.1", port=0, lifespan="off", **options)
    running = uvicorn.Server(config)
    thread = threading.Thread(target=running.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not running.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = running.servers[0].sockets[0].getsockname()[1]
    yield request.param, port
    running.should_exit = True
    thread.join(10)


def _refusal(name: str) -> int:
    return 431 if name == "httptools" else 400


class Conn:
    """A raw client connection that reads responses as they come."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.file = self.sock.makefile("rb")

    def close(self) -> None:
        self.file.close()
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, bytes]:
        status_line = self.file.readline()
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        length = 0
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return int(status_line.split()[1]), self.file.read(length)

    def wait_closed(self, limit_s: float) -> tuple[bytes, float]:
        """What the server sends until it closes the connection, and how long that took."""
        start = time.monotonic()
        self.sock.settimeout(limit_s)
        try:
            data = self.file.read()
        except TimeoutError:
            pytest.fail(f"the connection was still open after {limit_s} s")
        except ConnectionResetError:
            data = b""
        return data, time.monotonic() - start

    def dribble(self, first: bytes, limit_s: float) -> float:
        """Send `first`, then a header line every 0.1 s; seconds until the server hangs up."""
        return dribble(self.sock, first, limit_s, every_s=0.1)


@pytest.fixture
def conn(server: tuple[str, int]) -> Iterator[Conn]:
    connection = Conn(server[1])
    yield connection
    connection.close()


def _assert_refused(conn: Conn, status: int) -> None:
    """The next response is `status`, and the server closes the connection after it."""
    data, _ = conn.wait_closed(limit_s=5)  # h11's 400 has no length: it ends at the close
    assert data.startswith(b"HTTP/1.1 %d " % status), data[:200]


def _get(path: str, size: int | None = None) -> bytes:
    """A GET head; `size` pads it to exactly that many bytes."""
    head = f"GET {path} HTTP/1.1\r\nHost: test\r\n".encode()
    if size is None:
        return head + b"\r\n"
    pad = size - len(head) - len(b"X-Pad: \r\n\r\n")
    return head + b"X-Pad: " + b"a" * pad + b"\r\n\r\n"


def _post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    )


def test_keep_alive_requests_are_served(conn: Conn) -> None:
    conn.send(_get("/a"))
    assert conn.response() == (200, b"GET /a 0")
    conn.send(_post("/b", b"x" * 10_000))
    assert conn.response() == (200, b"POST /b 10000")


def test_pipelined_requests_are_served(conn: Conn) -> None:
    """Bodies larger than the head bound in the same read are not taken for a head."""
    body = b"x" * (3 * MAX_HEAD)
    conn.send(_get("/a") + _post("/b", body) + _get("/c", MAX_HEAD - 100) + _post("/d", b"y"))
    responses = [conn.response() for _ in range(4)]
    assert responses == [
        (200, b"GET /a 0"),
        (200, b"POST /b %d" % len(body)),
        (200, b"GET /c 0"),
        (200, b"POST /d 1"),
    ]


def test_a_slow_head_within_the_deadline_is_served(conn: Conn) -> None:
    head = _get("/slow", 1000)
    for i in range(0, len(head), 200):  # 5 pieces over 0.4 s, well inside the deadline
        conn.send(head[i : i + 200])
        time.sleep(0.1)
    assert conn.response() == (200, b"GET /slow 0")


def test_a_head_dribbled_past_the_deadline_is_closed(conn: Conn) -> None:
    elapsed = conn.dribble(b"GET / HTTP/1.1\r\nHost: test\r\n", HEADER_TIMEOUT_S + 5)
    assert HEADER_TIMEOUT_S * 0.9 <= elapsed <= HEADER_TIMEOUT_S + 2


def test_the_deadline_applies_to_the_next_request_on_a_connection(conn: Conn) -> None:
    conn.send(_get("/a"))
    assert conn.response()[0] == 200
    elapsed = conn.dribble(b"GET /b HTTP/1.1\r\n", HEADER_TIMEOUT_S + 5)
    assert HEADER_TIMEOUT_S * 0.9 <= elapsed <= HEADER_TIMEOUT_S + 2


def test_a_response_slower_than_the_deadline_is_not_cut(conn: Conn) -> None:
    """The deadline is on the head only: a request being served is not waiting for one."""
    conn.send(_get("/sleep"))
    assert conn.response() == (200, b"GET /sleep 0")
    conn.send(_get("/after"))
    assert conn.response() == (200, b"GET /after 0")


def test_a_slow_pipelined_request_is_not_cut(conn: Conn) -> None:
    """The deadline armed when /a completes finds /sleep being served, not a head awaited."""
    conn.send(_get("/a") + _get("/sleep"))
    assert conn.response() == (200, b"GET /a 0")
    assert conn.response() == (200, b"GET /sleep 0")


@pytest.mark.parametrize("dribbled", [False, True], ids=["one-read", "dribbled"])
def test_a_head_growing_past_the_bound_is_refused(
    server: tuple[str, int], conn: Conn, dribbled: bool
) -> None:
    unfinished = b"GET / HTTP/1.1\r\nHost: test\r\nX-Big: " + b"a" * (MAX_HEAD + 100)
    if dribbled:  # many small packets, all inside the deadline
        for i in range(0, len(unfinished), 256):
            conn.send(unfinished[i : i + 256])
            time.sleep(0.005)
    else:
        conn.send(unfinished)
    _assert_refused(conn, _refusal(server[0]))


def test_an_oversized_pipelined_head_is_refused_after_the_responses_owed(
    server: tuple[str, int], conn: Conn
) -> None:
    conn.send(_get("/sleep") + b"GET /big HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD + 100))
    assert conn.response() == (200, b"GET /sleep 0")
    _assert_refused(conn, _refusal(server[0]))


# httptools only: h11 bounds a head only while it is unfinished (a complete one of any
# size in one read passes, and the app's middleware answers 431), httptools exactly.


httptools_only = pytest.mark.parametrize("server", ["httptools"], indirect=True)


@httptools_only
def test_a_head_of_exactly_the_bound_is_served_one_byte_more_is_not(conn: Conn) -> None:
    over = _get("/over", MAX_HEAD + 1)
    conn.send(_get("/max", MAX_HEAD) + over[:10])  # the next head starts in the same read
    assert conn.response() == (200, b"GET /max 0")
    conn.send(over[10:])
    _assert_refused(conn, 431)


@httptools_only
def test_the_bound_counts_each_pipelined_head_from_its_own_start(conn: Conn) -> None:
    body = b"x" * (2 * MAX_HEAD)
    conn.send(_post("/a", body) + _get("/b", MAX_HEAD) + _get("/c", MAX_HEAD) + _get("/d", 300))
    assert [conn.response()[1] for _ in range(4)] == [
        b"POST /a %d" % len(body),
        b"GET /b 0",
        b"GET /c 0",
        b"GET /d 0",
    ]
    conn.send(_get("/e", MAX_HEAD) + _get("/f", MAX_HEAD + 1))
    assert conn.response() == (200, b"GET /e 0")
    _assert_refused(conn, 431)


@httptools_only
def test_a_head_after_a_chunked_body_is_counted_from_its_start(conn: Conn) -> None:
    chunked = b"POST /chunked HTTP/1.1\r\nHost: test\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"%x\r\n" % (2 * MAX_HEAD) + b"x" * (2 * MAX_HEAD) + b"\r\n0\r\n\r\n"
    head = _get("/next", MAX_HEAD)
    conn.send(chunked + head[:100])  # the next head starts in the body's read
    conn.send(head[100:])
    assert conn.response() == (200, b"POST /chunked %d" % (2 * MAX_HEAD))
    assert conn.response() == (200, b"GET /next 0")
    conn.send(chunked + b"GET /big HTTP/1.1\r\nX-Big: " + b"a" * MAX_HEAD)
    assert conn.response()[0] == 200
    _assert_refused(conn, 431)


def test_a_forwarded_for_header_does_not_change_the_peer(conn: Conn) -> None:
    """uvicorn's proxy-header rewriting is off: a local client cannot pick its source
    address (client_address.py reads the header, behind the proxies an operator listed)."""
    conn.send(b"GET /client HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n")
    data, _ = b"", None
    while b"\r\n0\r\n\r\n" not in data:
        data += conn.sock.recv(65536)
    assert b"127.0.0.1" in data
    assert b"203.0.113.9" not in data
