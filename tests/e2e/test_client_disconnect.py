"""A client that leaves a non-streamed request stops it, on the embedded default (`hydrant
serve`, the engine a child process): uvicorn never cancels a handler whose client left, and
only a streamed response watches its connection, so the gateway watches it itself
(platform/http/disconnect.py). Without that the request ran to its end, held a place in
the engine's batch and was billed in full, for nobody."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

LONG_OUTPUT = 16000  # a long context's worth of decoding: far longer than the test waits


@pytest.fixture(scope="module")
def server(
    long_demo_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with hydrant_server(tmp_path_factory.mktemp("serve"), long_demo_dir) as running:
        yield running


def ledger_rows(server: RunningServer, tenant_id: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(server.data_dir / "hydrant.db") as db:
        return db.execute(
            "SELECT status, input_tokens, output_tokens FROM ledger_entries WHERE tenant_id = ?",
            (tenant_id,),
        ).fetchall()


def test_a_client_that_leaves_a_non_streamed_request_stops_it(server: RunningServer) -> None:
    tenant_id, key = server.tenant_key("leaves-whole")
    payload = json.dumps(
        {
            "model": "demo",
            "prompt": "The quick brown fox",
            "max_tokens": LONG_OUTPUT,
            "ignore_eos": True,
        }
    ).encode()
    address = urlsplit(server.base_url)
    assert address.hostname is not None and address.port is not None
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {address.netloc}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(head + payload)
        time.sleep(1.0)  # admitted and generating by now: then the client leaves
    deadline = time.monotonic() + 60
    while not (rows := ledger_rows(server, tenant_id)) and time.monotonic() < deadline:
        time.sleep(0.1)
    # One entry, stopped short of its end, billed for what was generated before the client
    # left (a request run to its end would be `finished` with all 16,000 tokens).
    ((status, input_tokens, output_tokens),) = rows
    assert status == "stopped"
    assert input_tokens > 0 and 1 <= output_tokens < LONG_OUTPUT


def test_a_client_that_stays_gets_its_answer(server: RunningServer) -> None:
    """The watch does not stop a request whose client is still there."""
    tenant_id, key = server.tenant_key("stays-whole")
    answer = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": "demo", "prompt": "Hello", "max_tokens": 64, "ignore_eos": True},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 64
    assert ledger_rows(server, tenant_id) == [
        ("finished", answer.json()["usage"]["prompt_tokens"], 64)
    ]
