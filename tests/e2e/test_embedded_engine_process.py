"""The embedded default's engine runs in a child process of `hydrant serve` (issue #24).

A real `hydrant serve` with no configuration but a model (no Redis, no
PostgreSQL), called with the official `openai` client: the engine answers
from another process, a child of the server that registered in the server's
own registry directory; killing the child gives errors or a wait, never a hang,
and a new child serves again; the server's SIGTERM stops the child, and a
server killed outright takes its child with it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from hydrant_server import RunningServer, hydrant_server
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ENV = {"HYDRANT_POOL_WAKE_TIMEOUT_S": "30", "HYDRANT_LOG_FORMAT": "json"}


def children_of(pid: int) -> list[int]:
    """Pids of the processes whose parent is `pid` (from /proc), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def engine_child(server: RunningServer) -> int:
    """The one engine child of the server, as its registry record names it."""
    records = list((server.data_dir / "workers" / f"serve-{server.process.pid}").glob("*.json"))
    assert len(records) == 1, records
    pid = int(json.loads(records[0].read_text())["pid"])
    assert pid in children_of(server.process.pid)
    assert "worker" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return pid


def wait_until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def ready(server: RunningServer) -> bool:
    return httpx.get(f"{server.base_url}/readyz", timeout=5).status_code == 200


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_the_engine_serves_from_a_child_that_dies_restarts_and_stops_with_the_server(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with hydrant_server(data, demo_model_dir, env=ENV) as server:
        _, secret = server.tenant_key("embedded")
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0)
        with client:
            child = engine_child(server)
            assert child != server.process.pid

            whole = client.completions.create(
                model="demo", prompt="The river", max_tokens=12, temperature=0
            )
            assert whole.usage is not None and whole.usage.completion_tokens > 0
            pieces = client.completions.create(
                model="demo", prompt="The river", max_tokens=12, temperature=0, stream=True
            )
            streamed = "".join(chunk.choices[0].text for chunk in pieces if chunk.choices)
            assert streamed == whole.choices[0].text  # greedy: the same answer both ways

            # The child's engine metrics are on the gateway's /metrics, as in-process ones were.
            scrape = httpx.get(f"{server.base_url}/metrics", timeout=10).text
            names = {family.name for family in text_string_to_metric_families(scrape)}
            assert {"hydrant_num_requests_running", "hydrant_kv_cache_usage_perc"} <= names

            # A stream in flight when its engine dies ends (an error), it does not hang.
            outcome: list[str] = []

            def long_stream() -> None:
                try:
                    stream = client.completions.create(
                        model="demo",
                        prompt="The river",
                        max_tokens=2000,
                        stream=True,
                        extra_body={"ignore_eos": True},
                        timeout=60,
                    )
                    for n, _ in enumerate(stream):
                        if n == 2:
                            outcome.append("streaming")
                    outcome.append("ended")
                except openai.APIError as exc:
                    outcome.append(f"error: {type(exc).__name__}")

            streaming = threading.Thread(target=long_stream)
            streaming.start()
            wait_until(lambda: bool(outcome), 30, "the long stream to start")
            assert outcome == ["streaming"], outcome
            os.kill(child, signal.SIGKILL)
            streaming.join(45)
            assert not streaming.is_alive(), "the stream hung after its engine died"
            assert len(outcome) == 2, outcome

            # The next request waits for the new child (or gets a 503), within bounds.
            started = time.monotonic()
            try:
                again = client.completions.create(
                    model="demo", prompt="The river", max_tokens=12, temperature=0, timeout=90
                )
                assert again.choices[0].text == whole.choices[0].text
            except openai.APIStatusError as exc:
                assert exc.status_code == 503
            assert time.monotonic() - started < 60
            wait_until(lambda: ready(server), 60, "/readyz after the restart")
            replacement = engine_child(server)
            assert replacement != child
            answer = client.completions.create(
                model="demo", prompt="The river", max_tokens=12, temperature=0
            )
            assert answer.choices[0].text == whole.choices[0].text

        # uvicorn re-raises the SIGTERM once its shutdown is done: -15 after a clean stop.
        assert server.stop() in (0, -signal.SIGTERM)
        assert not alive(replacement), "the engine child outlived the server's SIGTERM"
        assert not (data / "workers" / f"serve-{server.process.pid}").exists()
    log = server.log_file.read_text()
    assert "gateway stopped" in log  # the lifespan's shutdown ran: it stopped the child
    assert "engine process died" in log
    assert "model loaded" in log  # the child's own load lines are in the serve log


def test_a_server_killed_outright_takes_its_engine_child_with_it(
    tmp_path: Path, demo_model_dir: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with hydrant_server(data, demo_model_dir, env=ENV) as server:
        child = engine_child(server)
        server.process.kill()
        server.process.wait()
        wait_until(lambda: not alive(child), 30, "the orphaned engine child to exit")
