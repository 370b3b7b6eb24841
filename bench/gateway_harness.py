"""The gateway process of `bench/gateway.py`: the real app, with clocks around the engine.

It builds the gateway exactly as `hydrant serve` does (auth, quotas, ledger,
in-process engine), serves it with uvicorn as `hydrant serve` does (same
protocol class and limits: `server_options`), and adds two clocks that change
nothing on the request path: one around the engine client (the time the
gateway waits on the engine for each request, by request id) and one around
the ASGI app (from the app being called to the last body byte handed to the
server). The orchestrator asks for these over a pipe after each load level,
and also asks this process for the baseline: the same requests sent straight
to the same in-process engine, with no HTTP, auth, quotas or ledger.
"""

from __future__ import annotations

import asyncio
import cProfile
import dataclasses
import io
import pstats
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from hydrant.engine.protocol import (
    EngineClient,
    EngineStats,
    GenerateChunk,
    GenerateRequest,
    Sampling,
)
from hydrant.logs import configure_logging
from hydrant.platform.ledger.accounting import LedgerWriter, Outcome
from hydrant.platform.quotas.admission import Admission, Gatekeeper, RequestContext

MESSAGES = [{"role": "user", "content": "Say one word."}]


class TimedEngineClient:
    """`EngineClient` that adds up, per request, the time spent waiting on the engine.

    Only the waits inside the inner stream count: while the gateway holds a
    chunk (rendering it, say), the clock is stopped, so that time is overhead.
    """

    def __init__(self, inner: EngineClient, times: dict[str, float]) -> None:
        self.inner = inner
        self.times = times

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        stream = self.inner.generate(request)
        waited = 0.0
        try:
            while True:
                started = time.perf_counter()
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    waited += time.perf_counter() - started
                    self.times[request.request_id] = waited
                yield chunk
        finally:
            await stream.aclose()

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    def stats(self) -> EngineStats:
        return self.inner.stats()


Phases = dict[str, dict[str, float]]


class _Stopwatch:
    """Wall and this thread's CPU for one phase; at concurrency 1 the CPU is the phase's own."""

    def __init__(self, phase: dict[str, float], name: str) -> None:
        self.phase, self.name = phase, name

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc: object) -> None:
        self.phase[self.name] = time.perf_counter() - self.wall
        self.phase[self.name + "_cpu"] = time.thread_time() - self.cpu


class TimedAdmission:
    def __init__(self, inner: Admission, phase: dict[str, float]) -> None:
        self.inner = inner
        self.phase = phase

    @property
    def rate_limit_headers(self) -> Mapping[str, str]:
        return self.inner.rate_limit_headers

    async def settle(self, outcome: Outcome) -> None:
        with _Stopwatch(self.phase, "settle"):
            await self.inner.settle(outcome)


class TimedGate:
    """`Gatekeeper` wrapper: how long admission (the quota script) and settlement take."""

    def __init__(self, inner: Gatekeeper, phases: Phases) -> None:
        self.inner = inner
        self.phases = phases

    async def admit(self, ctx: RequestContext) -> Admission:
        phase = self.phases.setdefault(ctx.request_id, {})
        with _Stopwatch(phase, "admit"):
            return TimedAdmission(await self.inner.admit(ctx), phase)


class TimedLedger:
    """`LedgerWriter` wrapper: how long the request's ledger entry takes to write."""

    def __init__(self, inner: LedgerWriter, phases: Phases) -> None:
        self.inner = inner
        self.phases = phases

    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        with _Stopwatch(self.phases.setdefault(ctx.request_id, {}), "ledger"):
            await self.inner.record(ctx, outcome)


class ServerClock:
    """ASGI wrapper: seconds from the app's call to its last body message, by request id."""

    def __init__(self, app: Any, times: dict[str, float]) -> None:
        self.app = app
        self.times = times

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = ""

        async def timed_send(message: Any) -> None:
            nonlocal request_id
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name == b"x-request-id":
                        request_id = value.decode()
            await send(message)
            final = message["type"] == "http.response.body" and not message.get("more_body")
            if final and request_id:
                self.times[request_id] = time.perf_counter() - started

        await self.app(scope, receive, timed_send)


async def baseline(
    client: EngineClient, prompt: list[int], concurrency: int, count: int
) -> tuple[list[float], float]:
    """The same requests straight to the engine: per-request latencies and the wall time."""
    latencies: list[float] = []
    remaining = count

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            request = GenerateRequest(
                request_id=f"base_{uuid.uuid4().hex}",
                prompt_token_ids=prompt,
                sampling=Sampling(max_tokens=1, temperature=0.0),
            )
            started = time.perf_counter()
            async for _ in client.generate(request):
                pass
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - started


class CpuClock:
    """CPU seconds since the last lap: the whole process, and the event loop's thread alone.

    Call it on the loop thread: that thread's CPU is the gateway's own work (HTTP,
    auth, quotas, ledger, rendering); the process adds the engine's step thread.
    """

    def __init__(self) -> None:
        self._process = time.process_time()
        self._loop = time.thread_time()

    def lap(self) -> tuple[float, float]:
        process, loop = time.process_time(), time.thread_time()
        lap = (process - self._process, loop - self._loop)
        self._process, self._loop = process, loop
        return lap


def _profile_text(profile: cProfile.Profile, top: int = 25) -> str:
    """The loop thread's hot spots, then the cumulative time of our own functions."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"/(platform|hydrant|engine)/", top)
    return out.getvalue()


async def _serve(conn: Connection, config: dict[str, Any]) -> None:
    import uvicorn

    from hydrant.platform.app import create_app
    from hydrant.platform.http.server_protocol import server_options
    from hydrant.platform.services import build_services, share_gil_with_engines
    from hydrant.runtime import load_embedded_engines
    from hydrant.settings import ModelSpec, Settings

    settings = Settings(
        data_dir=Path(config["data_dir"]),
        database_url=config["database_url"],
        redis_url=config["redis_url"],
        models=(ModelSpec("demo", Path(config["model_dir"])),),
        admin_bootstrap_key=config["admin_key"],
        secret_key=config["secret_key"],
        auto_migrate=False,
        kv_cache_bytes=64 * 1024 * 1024,
        log_level="WARNING",
        ledger_commit=config.get("ledger_commit", "database"),
    )
    engines = None
    if config.get("engine") == "worker":  # as `hydrant serve` with HYDRANT_WORKER_POOLS
        settings = dataclasses.replace(
            settings,
            worker_pools=True,
            worker_secret=config["worker_secret"],
            worker_registry_prefix=config["worker_prefix"],
            pool_start_workers=1,
            pool_max_workers=1,  # one engine process, started by the gateway's local scaler
            pool_idle_timeout_s=3600.0,
        )
    else:
        engines = load_embedded_engines(settings)
        share_gil_with_engines()  # as `hydrant serve` does with in-process engines
    services = build_services(settings, registry=engines.registry if engines else None)
    assert services.inference is not None
    model = services.inference.registry.get("demo")
    raw_client = model.client
    engine_times: dict[str, float] = {}
    server_times: dict[str, float] = {}
    model.client = TimedEngineClient(raw_client, engine_times)
    phases: Phases = {}
    service = services.inference.inference
    service.gatekeeper = TimedGate(service.gatekeeper, phases)
    service.ledger = TimedLedger(service.ledger, phases)
    if engines is not None:
        services.on_stop.append(engines.shutdown)
    app = create_app(settings, services)
    server = uvicorn.Server(
        uvicorn.Config(
            ServerClock(app, server_times),
            host="127.0.0.1",
            port=config["port"],
            lifespan="on",
            **server_options(settings),  # the server `hydrant serve` runs
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
            raise RuntimeError("uvicorn stopped before it started")
        await asyncio.sleep(0.05)
    prompt = model.tokenizer.encode_chat(MESSAGES)
    # The first request waits for the engine (a worker process starts and loads the model).
    await baseline(raw_client, prompt, 1, 1)
    loop = asyncio.get_running_loop()
    profile: cProfile.Profile | None = None
    cpu = CpuClock()
    conn.send(("ready", None))
    while True:
        command, argument = await loop.run_in_executor(None, conn.recv)
        if command == "baseline":
            if profile is not None:  # the profile is the gateway's: not the baseline's engine
                profile.disable()
            cpu.lap()
            latencies, wall = await baseline(raw_client, prompt, *argument)
            conn.send(("baseline", (latencies, wall, cpu.lap())))
            if profile is not None:
                profile.enable()
        elif command == "times":
            times = (dict(engine_times), dict(server_times), dict(phases), cpu.lap())
            conn.send(("times", times))
            engine_times.clear()
            server_times.clear()
            phases.clear()
        elif command == "profile_start":
            profile = cProfile.Profile(time.thread_time)  # CPU of the loop thread, not waits
            profile.enable()
            conn.send(("ok", None))
        elif command == "profile_stop" and profile is not None:
            profile.disable()
            if config.get("profile_out"):  # for pstats / snakeviz: callers, callees
                profile.dump_stats(config["profile_out"])
            conn.send(("profile", _profile_text(profile)))
            profile = None
        else:
            break
    server.should_exit = True
    await serving


def run_gateway(conn: Connection, config: dict[str, Any]) -> None:
    """The child process's entry point (multiprocessing, spawn)."""
    # Logging as `hydrant serve` sets it up (INFO, JSON, redacted; HYDRANT_LOG_FILE), so each
    # request's "request finished" line is part of what is measured, as in production.
    configure_logging("INFO", "json", Path(config["data_dir"]) / "gateway.log")
    try:
        asyncio.run(_serve(conn, config))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise
    finally:
        conn.close()
