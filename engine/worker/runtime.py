"""The worker's engine and its lifecycle: load, serve, sleep, wake, drain, unload.

One `WorkerRuntime` per process. Its `state` is what the registry publishes
and what the gateway routes on: only a `ready` worker takes new requests; a
`draining` one finishes what it holds and then exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from hydrant.engine.async_engine import AsyncLLMEngine, RequestStream
from hydrant.engine.engine_config import EngineConfig, parse_num_threads
from hydrant.engine.inprocess import InProcessEngineClient
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.metrics import EngineMetrics
from hydrant.engine.protocol import EngineStats, GenerateRequest
from hydrant.engine.worker.wire import WorkerRecord, WorkerState
from hydrant.heap import freeze_heap, thaw_heap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    model: str
    path: str
    secret: str
    device: str = "cpu"
    dtype: str = "float32"
    kv_cache_bytes: int = 256 * 1024 * 1024
    max_num_seqs: int = 256
    long_lane_tokens: int = 2048
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    num_threads: str = "auto"  # torch threads: "auto" or an integer (engine_config.py)
    max_prefill_tokens_while_decoding: int = 1024  # 0: no cap
    max_background_step_tokens: int = 64  # 0: no cap
    max_loras: int = 8  # LoRA adapters in device slots (EngineConfig)
    max_cpu_loras: int = 32
    max_lora_rank: int = 16
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str | None = None
    advertise_port: int = 0  # 0: the bound port; else the port a proxy or NAT forwards
    drain_timeout_s: float = 30.0
    keepalive_s: float = 2.0  # a silent step stream (link) sends an empty frame this often
    # Exempt the heap from GC scans once a model is loaded (hydrant/heap.py): the worker
    # process sets it; tests that run a runtime in their own process leave it off.
    freeze_heap: bool = False


class WorkerUnavailableError(Exception):
    """The worker takes no new request now (starting, asleep, draining): try another."""


class WorkerRuntime:
    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.worker_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.path = options.path
        self.quantization = options.quantization
        self.port = options.port
        self.state: WorkerState = "starting"
        self.metrics_registry = CollectorRegistry()
        self.engine: AsyncLLMEngine | None = None
        self._client: InProcessEngineClient | None = None
        self.max_model_len = 0
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._lock = asyncio.Lock()
        self.started_at = time.time()
        self.idle_since = self.started_at
        self.state_since = self.started_at
        self.on_change: Callable[[], None] = lambda: None
        self.drained = asyncio.Event()

    # ---- what the registry publishes ------------------------------------------------------

    @property
    def address(self) -> str:
        host = self.options.advertise_host or self.options.host
        return f"http://{host}:{self.options.advertise_port or self.port}"

    def stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    def record(self) -> WorkerRecord:
        return WorkerRecord(
            worker_id=self.worker_id,
            model=self.options.model,
            address=self.address,
            device=self.options.device,
            state=self.state,
            path=self.path,
            quantization=self.quantization,
            pid=os.getpid(),
            capacity=self.options.max_num_seqs,
            max_model_len=self.max_model_len,
            inflight=self.inflight,
            idle_since=self.idle_since,
            stats=self.stats(),
            started_at=self.started_at,
            heartbeat_at=time.time(),
            state_since=self.state_since,
        )

    def _set_state(self, state: WorkerState) -> None:
        if state != self.state:
            log.info("worker state", extra={"from": self.state, "to": state})
            self.state = state
            self.state_since = time.time()
            self.on_change()

    # ---- load / unload ----------------------------------------------------------------------

    def _build(self, path: str, quantization: str | None) -> LLMEngine:
        config = EngineConfig(
            device=self.options.device,
            dtype=self.options.dtype,
            kv_cache_bytes=self.options.kv_cache_bytes,
            max_num_seqs=self.options.max_num_seqs,
            long_lane_tokens=self.options.long_lane_tokens,
            quantization=quantization,  # type: ignore[arg-type]  # validated by EngineConfig
            kv_cache_dtype=self.options.kv_cache_dtype,  # type: ignore[arg-type]  # validated there
            enforce_eager=self.options.enforce_eager,
            enable_prefix_caching=self.options.enable_prefix_caching,
            num_threads=parse_num_threads(self.options.num_threads),
            max_prefill_tokens_while_decoding=self.options.max_prefill_tokens_while_decoding
            or None,
            max_background_step_tokens=self.options.max_background_step_tokens or None,
            max_loras=self.options.max_loras,
            max_cpu_loras=self.options.max_cpu_loras,
            max_lora_rank=self.options.max_lora_rank,
            show_progress=False,
        )
        metrics = EngineMetrics(self.metrics_registry, model=self.options.model)
        return LLMEngine.from_pretrained(path, config, metrics=metrics)  # type: ignore[arg-type]

    async def load(self, path: str | None = None, quantization: str | None = None) -> None:
        """Build the engine (in a thread: loading blocks) and start taking requests."""
        async with self._lock:
            if self.engine is not None:
                raise RuntimeError("a model is loaded: unload it first")
            path = path or self.path
            quantization = quantization if path != self.path else self.quantization
            self._set_state("starting")
            started = time.perf_counter()
            try:
                engine = await asyncio.to_thread(self._build, path, quantization)
            except Exception:
                self._set_state("unloaded")
                raise
            self.path, self.quantization = path, quantization
            self.max_model_len = engine.max_model_len
            self.engine = AsyncLLMEngine(engine)
            self.engine.start()
            self._client = InProcessEngineClient(self.engine)
            frozen = freeze_heap() if self.options.freeze_heap else 0
            log.info(
                "model loaded",
                extra={
                    "model": self.options.model,
                    "seconds": round(time.perf_counter() - started, 3),
                    "frozen_objects": frozen,
                },
            )
            self._set_state("ready")

    async def unload(self) -> None:
        """Free the engine entirely (device and host memory); `load` brings it back from disk."""
        async with self._lock:
            if self.engine is None:
                return
            self._set_state("unloaded")
            await self._wait_idle(self.options.drain_timeout_s)
            engine, self.engine, self._client = self.engine, None, None
            await engine.shutdown()
            if self.options.freeze_heap:
                thaw_heap()  # the model's cycles may be collected again once unreferenced

    # ---- sleep / wake -------------------------------------------------------------------------

    async def sleep(self) -> None:
        """Give the device back, weights kept in host memory (the engine's sleep mode)."""
        async with self._lock:
            if self.engine is None or self.state != "ready":
                raise WorkerUnavailableError(f"cannot sleep in state {self.state}")
            self._set_state("sleeping")
            try:
                await self.engine.sleep()
            except BaseException:
                self._set_state("ready")
                raise

    async def wake(self) -> None:
        async with self._lock:
            if self.engine is None:
                raise WorkerUnavailableError("no model is loaded")
            if self.state == "ready":
                return
            if self.state != "sleeping":
                raise WorkerUnavailableError(f"cannot wake in state {self.state}")
            await self.engine.wake()
            # Woken for a request on its way: not idle since long ago, or an idle check
            # (a gateway's, the reaper's) could put it back to sleep before that arrives.
            self.idle_since = time.time()
            self._set_state("ready")

    # ---- requests -------------------------------------------------------------------------

    async def open(self, request: GenerateRequest) -> RequestStream:
        """Start the request; its outputs come on the stream (see `AsyncLLMEngine.open`)."""
        if self.state != "ready" or self._client is None:
            raise WorkerUnavailableError(f"worker is {self.state}")
        return await self._client.open(request)

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight <= 0:
            self.inflight = 0
            self.idle_since = time.time()
            self._idle.set()

    async def abort(self, request_id: str) -> None:
        if self.engine is not None:
            await self.engine.abort(request_id)

    async def _wait_idle(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False

    # ---- drain ------------------------------------------------------------------------------

    async def drain(self) -> None:
        """Stop taking work, finish what we hold (bounded), then signal the process to exit.

        Requests still running at the deadline end with an `unavailable` frame
        (the engine is shut down): the gateway retries those that produced no
        token on another worker.
        """
        if self.state == "draining":
            return
        self._set_state("draining")
        finished = await self._wait_idle(self.options.drain_timeout_s)
        if not finished:
            log.warning(
                "drain timed out; ending the remaining requests", extra={"left": self.inflight}
            )
        if self.engine is not None:
            engine, self.engine, self._client = self.engine, None, None
            await engine.shutdown()
            if self.options.freeze_heap:
                thaw_heap()  # the model's cycles may be collected again once unreferenced
            await self._wait_idle(5.0)
        self.drained.set()

    async def close(self) -> None:
        if self.engine is not None:
            engine, self.engine = self.engine, None
            await engine.shutdown()
