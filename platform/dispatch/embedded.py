"""The embedded default's engines as child processes of `hydrant serve` (issue #24).

An engine thread inside the gateway shares the GIL with the gateway's event
loop: every engine step's Python delays the loop and the reverse (measured
1.5-1.8x the time per output token of worker-pool mode). So by default
(`HYDRANT_EMBEDDED_ENGINE=process`) `hydrant serve` starts one `hydrant
worker` child per model and dispatches to it through the pool path
(`WorkerPool`, `WorkerHttp`), like worker-pool mode but with no other service:

- the registry is a directory of record files (`FileWorkerDirectory`) under
  `data/workers/serve-<gateway pid>/`, not Redis;
- the worker secret is made for this run, and the children listen on
  127.0.0.1 on a free port;
- the children are started, stopped (SIGTERM, then a kill) and counted by
  the same `LocalProcessScaler` as worker-pool mode's, writing to the
  gateway's log, and exit when the gateway is gone;
- `EmbeddedSupervisor` restarts a child that died unasked (with a backoff
  when it keeps dying) and keeps each model's readiness state, so `/readyz`
  is false until its engine serves;
- `ChildMetrics` puts the children's engine metrics in the gateway's
  `/metrics`, where the in-process engines' were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from hydrant.engine.worker.wire import SECRET_HEADER
from hydrant.errors import ConfigurationError
from hydrant.platform.dispatch.file_directory import FileWorkerDirectory, process_alive
from hydrant.platform.dispatch.pool import WorkerPool
from hydrant.platform.dispatch.scaler import LocalProcessScaler, local_worker_env
from hydrant.platform.dispatch.service import PoolManager, assemble_pools
from hydrant.platform.models.checkpoints import inspect_checkpoint
from hydrant.platform.models.registry import ModelRegistry
from hydrant.settings import Settings

log = logging.getLogger(__name__)

RUN_DIR_PREFIX = "serve-"
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # a child that keeps dying early
STABLE_AFTER_S = 30.0  # a child that lived this long resets the backoff
SCRAPE_TIMEOUT_S = 2.0


def registry_dir(data_dir: Path, pid: int | None = None) -> Path:
    """This gateway's own registry directory: a second gateway on the same data
    directory never dispatches to (or with the secret of) another one's children."""
    return data_dir / "workers" / f"{RUN_DIR_PREFIX}{pid or os.getpid()}"


def remove_stale_registry_dirs(data_dir: Path) -> None:
    """Remove registry directories of gateways that are gone (killed without a clean stop)."""
    root = data_dir / "workers"
    if not root.is_dir():
        return
    for entry in root.glob(f"{RUN_DIR_PREFIX}*"):
        pid = entry.name.removeprefix(RUN_DIR_PREFIX)
        if entry.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True)


def child_env(settings: Settings, secret: str, directory: Path) -> dict[str, str]:
    """The children's settings, given explicitly: whatever `serve` got from flags or a
    config file reaches them, and nothing of the gateway's own (its port, Redis) does."""
    env = local_worker_env(
        {
            k: v
            for k, v in os.environ.items()
            if k not in ("HYDRANT_WORKER_ADVERTISE_HOST", "HYDRANT_WORKER_ADVERTISE_PORT")
        },
        {
            "HYDRANT_WORKER_SECRET": secret,
            "HYDRANT_WORKER_REGISTRY_DIR": str(directory),
            "HYDRANT_WORKER_PARENT_PID": str(os.getpid()),
            "HYDRANT_WORKER_HEARTBEAT_S": str(settings.worker_heartbeat_s),
            "HYDRANT_WORKER_HEARTBEAT_TTL_S": str(settings.worker_heartbeat_ttl_s),
            "HYDRANT_WORKER_DRAIN_TIMEOUT_S": str(settings.worker_drain_timeout_s),
            "HYDRANT_WORKER_KEEPALIVE_S": str(settings.worker_keepalive_s),
            "HYDRANT_KV_CACHE_BYTES": str(settings.kv_cache_bytes),
            "HYDRANT_MAX_NUM_SEQS": str(settings.max_num_seqs),
            "HYDRANT_LONG_LANE_TOKENS": str(settings.long_lane_tokens),
            # unset stays unset: the child resolves it by its own device
            "HYDRANT_MAX_BACKGROUND_STEP_TOKENS": str(
                ""
                if settings.max_background_step_tokens is None
                else settings.max_background_step_tokens
            ),
            "HYDRANT_DTYPE": settings.dtype,
            "HYDRANT_KV_CACHE_DTYPE": settings.kv_cache_dtype,
            "HYDRANT_ENFORCE_EAGER": str(settings.enforce_eager).lower(),
            "HYDRANT_ENABLE_PREFIX_CACHING": str(settings.enable_prefix_caching).lower(),
            "HYDRANT_DATA_DIR": str(settings.data_dir),
            "HYDRANT_LOG_LEVEL": settings.log_level,
            "HYDRANT_LOG_FORMAT": settings.log_format,
            # The serve log: the children's load progress and errors land where the
            # operator reads the gateway's (stderr when no file is set).
            "HYDRANT_LOG_FILE": str(settings.log_file) if settings.log_file else None,
        },
    )
    env.pop("HYDRANT_REDIS_URL", None)  # the directory is their registry, never Redis
    env.pop("HYDRANT_DATABASE_URL", None)  # an engine needs no database
    return env


@dataclass
class EmbeddedPools:
    """What `build_embedded_pools` made: the gateway's registry and pools, and their parts."""

    registry: ModelRegistry
    manager: PoolManager
    scaler: LocalProcessScaler
    secret: str
    directory: Path

    async def cleanup(self) -> None:
        """Remove this run's registry directory (its children have stopped)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def supervisor(self) -> EmbeddedSupervisor:
        return EmbeddedSupervisor(self.manager, self.registry, self.scaler)

    def metrics_registry(self) -> CollectorRegistry:
        return child_metrics(self.manager, self.secret)


def build_embedded_pools(settings: Settings) -> EmbeddedPools:
    """A pool of one child engine per served model (`manager.start()` starts them).

    Each checkpoint is checked here first: what cannot be loaded is a usage error
    of `hydrant serve` now, not a child that dies at load over and over.
    """
    for spec in settings.served_models():
        info = inspect_checkpoint(Path(spec.path))
        if not info.loadable:
            raise ConfigurationError(
                f"model {spec.name}: {spec.path} cannot be served: {'; '.join(info.problems)}"
            )
    directory = registry_dir(settings.data_dir.resolve())
    remove_stale_registry_dirs(settings.data_dir)
    shutil.rmtree(directory, ignore_errors=True)  # a reused pid's leftovers
    directory.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(32)
    scaler = LocalProcessScaler(
        env=child_env(settings, secret, directory),
        log_dir=None,
        device=settings.device,
        stop_timeout_s=settings.worker_drain_timeout_s + 15,
        track_deaths=True,
    )
    # One engine per model, as in-process: more would share the same cores.
    pooled = replace(settings, pool_start_workers=1, pool_max_workers=1)
    registry, manager = assemble_pools(
        pooled,
        FileWorkerDirectory(directory, settings.worker_heartbeat_ttl_s),
        secret,
        scaler,
    )
    manager.embedded = True
    for served in registry.all():
        served.state = "loading"
    return EmbeddedPools(registry, manager, scaler, secret, directory)


@dataclass
class _ModelWatch:
    failures: int = 0  # early deaths in a row
    restart_at: float | None = None  # monotonic: when to start the next child
    ready_logged: bool = False
    ever_ready: bool = False
    started: float = field(default_factory=time.monotonic)


@dataclass
class EmbeddedSupervisor:
    """Restarts dead children and keeps each model's state for `/readyz`.

    A background service of the gateway (started after the pools, stopped
    before them): a child stopped by the gateway (shutdown, a swap, scale to
    zero in `exit` mode) is not restarted; one that exited unasked is, at once
    the first time and with a growing delay when it keeps dying before it has
    served a while. Requests meanwhile wait for the pool (bounded by
    `HYDRANT_POOL_WAKE_TIMEOUT_S`, then a 503); one streaming when its child
    died ends with the pool's `worker_lost` error.
    """

    manager: PoolManager
    registry: ModelRegistry
    scaler: LocalProcessScaler
    interval_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    _watch: dict[str, _ModelWatch] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        now = self.clock()
        self._watch = {model: _ModelWatch(started=now) for model in self.manager.pools}
        self._task = asyncio.create_task(self._loop(), name="embedded-supervisor")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.check()
            except Exception as exc:  # never let a bad tick end supervision
                log.warning("engine supervision failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(self.interval_s)

    async def check(self) -> None:
        now = self.clock()
        self.scaler.reap()
        died, self.scaler.died = self.scaler.died, []
        for child in died:
            watch = self._watch.setdefault(child.spec.model, _ModelWatch(started=now))
            lived = now - child.started_at
            watch.failures = 1 if lived >= STABLE_AFTER_S else watch.failures + 1
            step = min(watch.failures - 2, len(RESTART_BACKOFF_S) - 1)
            delay = 0.0 if watch.failures == 1 else RESTART_BACKOFF_S[step]
            watch.restart_at = now + delay
            watch.started = now + delay
            watch.ready_logged = False
            log.warning(
                "engine process died: restarting",
                extra={
                    "model": child.spec.model,
                    "exit_code": child.process.returncode,
                    "restart_in_s": delay,
                },
            )
        for model, pool in self.manager.pools.items():
            watch = self._watch.setdefault(model, _ModelWatch(started=now))
            children = {c.process.pid for c in self.scaler.running(model=model)}
            if watch.restart_at is not None and now >= watch.restart_at:
                watch.restart_at = None
                if not children:
                    await self.scaler.scale(pool.spec, 1)
                    children = {c.process.pid for c in self.scaler.running(model=model)}
            self._update_state(model, pool, watch, children, now)

    def _update_state(
        self, model: str, pool: WorkerPool, watch: _ModelWatch, children: set[int], now: float
    ) -> None:
        served = self.registry.get(model)
        # Only records of children running now: a dead one's lingers until the directory
        # drops it (at the next poll), and a request sent there would only be retried.
        states = {
            s.record.state
            for s in pool.workers.values()
            if not s.retired and s.record.pid in children
        }
        if states & {"ready", "sleeping"}:
            served.state = "loaded"  # readiness: servable (asleep, it wakes on a request)
            watch.ever_ready = True
            if not watch.ready_logged:
                watch.ready_logged = True
                log.info(
                    "engine process ready",
                    extra={"model": model, "seconds": round(now - watch.started, 2)},
                )
        elif not children and watch.restart_at is None and watch.ever_ready:
            served.state = "loaded"  # the pool scaled it to zero (`exit`): a request wakes it
        elif watch.failures >= 2:
            served.state = "failed"  # it keeps dying: its log lines say why
        else:
            served.state = "loading"


class _ChildMetricsCollector:
    """At each scrape, the engine metrics of the children that serve (an HTTP GET each)."""

    def __init__(self, manager: PoolManager, secret: str) -> None:
        self._manager = manager
        self._headers = {SECRET_HEADER: secret}

    def describe(self) -> list[Metric]:
        return []  # names unknown until scraped: registered without a check

    def collect(self) -> Iterator[Metric]:
        for pool in self._manager.pools.values():
            for slot in list(pool.workers.values()):
                if slot.record.state not in ("ready", "sleeping"):
                    continue
                try:
                    answer = httpx.get(
                        f"{slot.record.address}/metrics",
                        headers=self._headers,
                        timeout=SCRAPE_TIMEOUT_S,
                    )
                    answer.raise_for_status()
                except httpx.HTTPError as exc:
                    log.info("engine metrics not scraped", extra={"error": type(exc).__name__})
                    continue
                yield from text_string_to_metric_families(answer.text)


def child_metrics(manager: PoolManager, secret: str) -> CollectorRegistry:
    """A registry for the gateway's `/metrics` that relays the children's engine metrics.

    The scrape is synchronous, so the `/metrics` route renders in a thread: a busy
    child answering slowly delays the scrape, never the gateway's event loop.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ChildMetricsCollector(manager, secret))
    return registry
