"""Run a worker process: serve HTTP, load the model, heartbeat, drain on SIGTERM, exit 0.

uvicorn's own SIGTERM handling would close the socket at once and cut the
streams in flight; here the first SIGTERM (or SIGINT, or `POST /drain`)
starts a drain instead: the worker publishes `draining` (the gateway stops
routing to it), finishes what it holds within `drain_timeout_s`, deregisters
and only then lets uvicorn stop. A second signal exits at once.

A worker that `hydrant serve` started for itself (the embedded default) is
given its parent's pid and drains the same way when that parent is gone, so a
gateway killed outright leaves no engine behind (the scaler's parent-death
signal does the same on Linux; this also covers the window before it is set).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping
from types import FrameType

import uvicorn

from hydrant.engine.host_memory import retain_freed_memory
from hydrant.engine.worker.app import create_worker_app
from hydrant.engine.worker.registration import Registration, RegistryTarget
from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime

log = logging.getLogger(__name__)


class _DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_signal: asyncio.Event) -> None:
        super().__init__(config)
        self._on_signal = on_signal
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in `_captured_signals`: uvicorn would re-raise it after shutdown,
        # and the default SIGTERM action would turn our clean exit 0 into a kill.
        self._signals += 1
        if self._signals > 1:
            self.should_exit = True
            self.force_exit = True
            return
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_signal.set)


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP spelled out: accepted sockets inherit the protocol number, and asyncio
    # turns Nagle off (TCP_NODELAY) only on sockets that say TCP. With proto 0 each small
    # frame written after the response head waited for the gateway's delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


PARENT_CHECK_S = 1.0


async def _watch_parent(parent_pid: int, on_gone: asyncio.Event) -> None:
    """Set `on_gone` once the process that started this one has exited (we are re-parented)."""
    while True:  # no event to wait on: nothing tells a process that its parent exited
        if os.getppid() != parent_pid:
            break
        await asyncio.sleep(PARENT_CHECK_S)
    log.warning("parent process gone: draining", extra={"parent_pid": parent_pid})
    on_gone.set()


async def serve_worker(
    options: WorkerOptions,
    registry: RegistryTarget,
    heartbeat_s: float,
    heartbeat_ttl_s: float,
    parent_pid: int | None = None,
) -> int:
    sock = _bind(options.host, options.port)
    runtime = WorkerRuntime(options)
    runtime.port = int(sock.getsockname()[1])
    app = create_worker_app(runtime)
    drain_requested = asyncio.Event()
    app.state.request_drain = drain_requested.set
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http="httptools",  # llhttp in C: a fraction of h11's CPU per request (a dependency)
    )
    server = _DrainingServer(config, drain_requested)
    server._loop = asyncio.get_running_loop()
    store = registry.open()
    registration = Registration(store, runtime.record, heartbeat_s, heartbeat_ttl_s)
    runtime.on_change = registration.beat_now
    registration.start()
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="worker-http")
    log.info("worker listening", extra={"address": runtime.address, "model": options.model})
    loading = asyncio.create_task(runtime.load(), name="worker-load")
    waiter = asyncio.create_task(drain_requested.wait())
    watcher = (
        asyncio.create_task(_watch_parent(parent_pid, drain_requested), name="worker-parent")
        if parent_pid
        else None
    )
    exit_code = 0
    try:
        done, _ = await asyncio.wait(
            {loading, waiter, serving}, return_when=asyncio.FIRST_COMPLETED
        )
        if loading in done and loading.exception() is not None:
            log.error("model load failed", exc_info=loading.exception())
            exit_code = 1
        elif serving not in done:
            await asyncio.wait({waiter, serving}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():  # a signal during the load: stop it from serving
            await asyncio.wait({loading}, timeout=options.drain_timeout_s)
        log.info("worker draining", extra={"inflight": runtime.inflight})
        await runtime.drain()
    finally:
        app.state.links.close()  # the held-open step streams end: the server can stop
        waiter.cancel()
        if watcher is not None:
            watcher.cancel()
        await registration.deregister()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 10)
        await runtime.close()
        await store.aclose()
        sock.close()
    log.info("worker stopped", extra={"exit_code": exit_code})
    return exit_code


# How long a thread may keep the GIL while another waits (Python's default: 5 ms). A worker
# has two: the engine's step thread, which runs Python between torch ops, and the event loop
# that writes its frames. At the default, whichever waits loses up to 5 ms per hand-over:
# the loop after each step's outputs arrive, the step thread after each socket write.
WORKER_SWITCH_INTERVAL_S = 0.0005
SWITCH_INTERVAL_ENV = "HYDRANT_WORKER_SWITCH_INTERVAL_MS"


def switch_interval_s(environ: Mapping[str, str] = os.environ) -> float:
    """The worker's GIL switch interval: `HYDRANT_WORKER_SWITCH_INTERVAL_MS` when it is a
    positive number (for measuring), else `WORKER_SWITCH_INTERVAL_S`."""
    raw = environ.get(SWITCH_INTERVAL_ENV, "").strip()
    try:
        value = float(raw) / 1000 if raw else 0.0
    except ValueError:
        value = 0.0
    return value if value > 0 else WORKER_SWITCH_INTERVAL_S


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it imports (a runtime dependency off Windows), else None
    (asyncio's): a worker writes a frame per gateway per step, event-loop work that
    libuv's loop does with less CPU, beside the engine thread that needs the GIL."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_worker(
    options: WorkerOptions,
    registry: RegistryTarget,
    heartbeat_s: float,
    heartbeat_ttl_s: float,
    parent_pid: int | None = None,
) -> int:
    """The blocking entry point of `hydrant worker`; returns the exit code."""
    retain_freed_memory()  # before any thread: they must all share the one arena
    sys.setswitchinterval(switch_interval_s())
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        return runner.run(serve_worker(options, registry, heartbeat_s, heartbeat_ttl_s, parent_pid))
