"""The gateway's pools: built from settings, fed by the registry, scaled down when idle, swapped.

`build_pools()` makes the `ModelRegistry` of a gateway that dispatches to
workers: per model the tokenizer (the gateway counts tokens itself; it reads
only `tokenizer.json`, no torch) and a `PoolClient` as its engine client.
`PoolManager` runs the two background loops: registry poll (so a worker that
stops heartbeating leaves within its TTL plus one poll) and idle scale-down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import redis.asyncio as aioredis

from hydrant.engine.tokenizer import Tokenizer
from hydrant.engine.worker.registration import RedisRegistryStore
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.errors import ConfigurationError
from hydrant.platform.adapters.peft_config import inspect_adapter
from hydrant.platform.dispatch.directory import WorkerDirectory, WorkerSource
from hydrant.platform.dispatch.fair_share import FairQueue
from hydrant.platform.dispatch.metrics import PoolMetrics, PoolSnapshot
from hydrant.platform.dispatch.pool import PoolOptions, WorkerPool
from hydrant.platform.dispatch.pool_client import PoolClient
from hydrant.platform.dispatch.routing import BLOCK_SIZE
from hydrant.platform.dispatch.scaler import (
    LocalProcessScaler,
    NoScaler,
    PoolSpec,
    Scaler,
    local_worker_env,
)
from hydrant.platform.dispatch.upstream_health import DrainMarks, UpstreamMonitor
from hydrant.platform.dispatch.upstream_http import UpstreamHttp
from hydrant.platform.dispatch.worker_http import WorkerHttp
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound, Unprocessable
from hydrant.platform.models.checkpoints import inspect_checkpoint
from hydrant.platform.models.registry import ModelRegistry, ServedModel
from hydrant.settings import Settings

if TYPE_CHECKING:
    from hydrant.platform.dispatch.kubernetes import KubernetesScaler

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 2048


def _kubernetes_scaler(settings: Settings) -> KubernetesScaler:
    from hydrant.platform.dispatch.kubernetes import KubernetesScaler

    return KubernetesScaler.from_settings(
        settings.k8s_api_url,
        settings.k8s_token,
        settings.k8s_namespace,
        settings.k8s_deployment,
        settings.k8s_container,
    )


def upstream_scaling(settings: Settings, sleep: bool = False) -> tuple[Scaler, PoolOptions]:
    """How an upstream pool scales: by KEDA or its operator, or from zero by this gateway.

    Without the kubernetes scaler the gateway scales nothing (KEDA's ScaledObject
    does, on the gateway's queue metric) and never stops a member when idle. With
    it, a request that finds no member scales the workload (a Deployment, or a
    LeaderWorkerSet: one replica is a whole group) to 1 and waits, bounded by the
    wake timeout, for the health checks to register it; after the idle timeout
    the workload goes back to 0 (`exit`). Never beyond 1: a Service is one member
    to the pool whatever runs behind it, so more replicas are KEDA's or an HPA's
    to decide.

    `sleep` (`HYDRANT_UPSTREAM_SLEEP`): the members run vLLM's sleep mode, so an idle
    pool sleeps (`POST /sleep?level=1`: weights to host memory, the device's memory
    freed) and the first request wakes it (`POST /wake_up`), seconds where a pod
    from zero takes minutes; the workload is still scaled from zero when no member
    is up at all, where the kubernetes scaler is on.
    """
    options = replace(pool_options(settings), start_workers=0)
    scaler: Scaler = NoScaler()
    if settings.pool_scaler == "kubernetes":
        scaler = _kubernetes_scaler(settings).for_upstream(settings.k8s_upstream_workload)
        options = replace(options, max_workers=1, scale_down="exit")
    elif not sleep:
        options = replace(options, idle_timeout_s=0.0)
    if sleep:
        options = replace(options, scale_down="sleep")
    return scaler, options


def make_scaler(settings: Settings) -> Scaler:
    if settings.pool_scaler == "none":
        return NoScaler()
    if settings.pool_scaler == "kubernetes":
        return _kubernetes_scaler(settings)
    env = local_worker_env(
        dict(os.environ),
        {
            "HYDRANT_REDIS_URL": settings.redis_url,
            "HYDRANT_WORKER_SECRET": settings.worker_secret,
            "HYDRANT_WORKER_REGISTRY_PREFIX": settings.worker_registry_prefix,
            "HYDRANT_WORKER_HEARTBEAT_S": str(settings.worker_heartbeat_s),
            "HYDRANT_WORKER_HEARTBEAT_TTL_S": str(settings.worker_heartbeat_ttl_s),
            "HYDRANT_WORKER_DRAIN_TIMEOUT_S": str(settings.worker_drain_timeout_s),
            "HYDRANT_WORKER_KEEPALIVE_S": str(settings.worker_keepalive_s),
            "HYDRANT_KV_CACHE_BYTES": str(settings.kv_cache_bytes),
            "HYDRANT_MAX_NUM_SEQS": str(settings.max_num_seqs),
            "HYDRANT_DTYPE": settings.dtype,
            "HYDRANT_DATA_DIR": str(settings.data_dir),
            "HYDRANT_LOG_LEVEL": settings.log_level,
            "HYDRANT_LOG_FORMAT": settings.log_format,
        },
    )
    return LocalProcessScaler(
        env=env,
        log_dir=settings.data_dir / "workers",
        device=settings.device,
        stop_timeout_s=settings.worker_drain_timeout_s + 15,
    )


def pool_options(settings: Settings) -> PoolOptions:
    return PoolOptions(
        start_workers=settings.pool_start_workers,
        max_workers=settings.pool_max_workers,
        idle_timeout_s=settings.pool_idle_timeout_s,
        scale_down=settings.pool_scale_down,
        wake_timeout_s=settings.pool_wake_timeout_s,
        swap_timeout_s=settings.pool_swap_timeout_s,
        prefix_blocks=settings.pool_prefix_blocks,
    )


class TimelineSink(Protocol):
    """Where worker states go for the cost reconciliation (reconciliation/recorder.py)."""

    async def record(self, records: Sequence[WorkerRecord]) -> int: ...


@dataclass
class PoolManager:
    directory: WorkerSource
    http: WorkerHttp
    scaler: Scaler
    metrics: PoolMetrics
    pools: dict[str, WorkerPool] = field(default_factory=dict)
    start_workers: int = 1
    poll_s: float = 0.25
    idle_check_s: float = 1.0
    registry: ModelRegistry | None = None
    # The embedded default's own engine children (dispatch.embedded), not an operator's
    # pools: no `/admin/pools` (no swap, as with in-process engines), and preflight's
    # pool checks do not apply.
    embedded: bool = False
    # Upstream pools' health checks: they register the members the registry poll then reads.
    monitors: list[UpstreamMonitor] = field(default_factory=list)
    # Where the pools' worker states are recorded for the cost reconciliation (a
    # `TimelineRecorder`), every `timeline_s`; None: not recorded.
    timeline: TimelineSink | None = None
    timeline_s: float = 5.0
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.metrics.watch(self.snapshots)

    def snapshots(self) -> list[PoolSnapshot]:
        return [pool.snapshot() for pool in self.pools.values()]

    def pool(self, model: str) -> WorkerPool:
        try:
            return self.pools[model]
        except KeyError:
            raise NotFound(f"no pool serves the model `{model}`", param="model") from None

    async def start(self) -> None:
        for monitor in self.monitors:  # members registered before the first request is routed
            try:
                await monitor.check()
            except Exception as exc:  # Redis away at start: the loop keeps trying
                log.warning("upstream health check failed", extra={"error": type(exc).__name__})
            self._tasks.append(
                asyncio.create_task(monitor.run(), name=f"upstream-health-{monitor.spec.model}")
            )
        await self.refresh()
        for pool in self.pools.values():
            if pool.kind != "hydrant":
                continue  # upstream servers are started by their own deployment
            missing = self.start_workers - len(pool.workers)
            if missing > 0:
                await self.scaler.scale(pool.spec, self.start_workers)
        self._tasks.append(asyncio.create_task(self._poll_loop(), name="pool-registry-poll"))
        self._tasks.append(asyncio.create_task(self._idle_loop(), name="pool-idle"))
        if self.timeline is not None and self.timeline_s > 0:
            self._tasks.append(asyncio.create_task(self._timeline_loop(), name="pool-timeline"))

    async def refresh(self) -> None:
        for pool in self.pools.values():
            pool.update(await self.directory.workers(pool.model))

    async def _poll_loop(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # Redis away: keep the last view, keep trying
                log.warning("worker registry poll failed", extra={"error": type(exc).__name__})
                await asyncio.sleep(1.0)
            await asyncio.sleep(self.poll_s)

    async def _timeline_loop(self) -> None:
        while True:
            await self.record_timeline()
            await asyncio.sleep(self.timeline_s)

    async def record_timeline(self) -> None:
        """Record the Hydrant pools' workers as the registry shows them now; a failure
        (database or Redis away) is logged and the next sample stretches over the gap."""
        if self.timeline is None:
            return
        try:
            records = [
                record
                for pool in self.pools.values()
                if pool.kind == "hydrant"
                for record in await self.directory.workers(pool.model)
            ]
            await self.timeline.record(records)
        except Exception as exc:
            log.warning("worker timeline not recorded", extra={"error": type(exc).__name__})

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(self.idle_check_s)
            for pool in list(self.pools.values()):
                try:
                    await pool.maybe_scale_down()
                except Exception as exc:
                    log.warning(
                        "idle scale-down failed",
                        extra={"model": pool.model, "error": type(exc).__name__},
                    )

    async def swap(
        self,
        model: str,
        path: str,
        quantization: str | None,
        adapters: Mapping[str, str] | None = None,
    ) -> int:
        """Hot swap to the checkpoint at `path`. The model keeps its LoRA `adapters` (name to
        directory): they are registered on the model's name, not on a checkpoint, and the
        new workers load them on first use; so a checkpoint they do not fit is refused
        here, where the gateway reads it, rather than failing each adapter request after."""
        pool = self.pool(model)
        pool.check_swappable()
        if quantization not in (None, "int8", "int4"):
            raise InvalidRequest(
                "quantization must be `int8`, `int4` or null", param="quantization"
            )
        checkpoint = Path(path)
        if isinstance(self.scaler, LocalProcessScaler):  # its workers read this very directory
            info = inspect_checkpoint(checkpoint)
            if not info.loadable:
                raise Unprocessable(
                    f"{path} cannot be served: {'; '.join(info.problems)}", param="path"
                )
            misfits = [
                f"{name}: {'; '.join(problems)}"
                for name, directory in sorted((adapters or {}).items())
                if (problems := inspect_adapter(Path(directory), checkpoint).problems)
            ]
            if misfits:
                raise Unprocessable(
                    f"the adapters of `{model}` do not fit {path} ({' | '.join(misfits)}):"
                    " remove them first, or swap to a checkpoint they fit",
                    param="path",
                    code="adapters_do_not_fit",
                )
        drained = await pool.swap(PoolSpec(model=model, path=path, quantization=quantization))
        served = self.registry.get(model) if self.registry is not None else None
        if served is not None and (checkpoint / "tokenizer.json").is_file():
            # The gateway counts tokens: with the new checkpoint's tokenizer from now on.
            served.tokenizer = Tokenizer.from_pretrained(checkpoint)
            served.max_model_len = inspect_checkpoint(checkpoint).max_model_len or (
                served.max_model_len
            )
        return drained

    async def drain(self, model: str, worker_id: str, drained: bool = True) -> WorkerPool:
        """Stop routing to one member, let its requests in flight finish (`drained=False`:
        route to it again, upstream members only: a drained worker exits)."""
        pool = self.pool(model)
        slot = pool.workers.get(worker_id)
        if slot is None:
            raise NotFound(f"the pool of `{model}` has no member `{worker_id}`", param="worker_id")
        if pool.kind == "hydrant":
            if not drained:
                raise Conflict(
                    "a drained worker exits when its requests are done: start another",
                    code="worker_drained",
                )
            slot.retired = True
            await pool.drain_worker(slot)
            return pool
        # The mark is in Redis and the record is published now; reading the registry back
        # makes this gateway follow at once, the others at their next poll.
        monitor = next(m for m in self.monitors if m.spec.model == model)
        await monitor.drain(worker_id, drained)
        pool.update(await self.directory.workers(model))
        return pool

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.scaler.close()
        await self.http.aclose()
        for pool in self.pools.values():
            if pool.kind != "hydrant":
                await pool.http.aclose()
        for monitor in self.monitors:
            await monitor.store.aclose()
            if monitor.drains is not None:
                await monitor.drains.aclose()
        await self.directory.aclose()


def build_pools(
    settings: Settings, scaler: Scaler | None = None
) -> tuple[ModelRegistry, PoolManager]:
    """The registry of pooled models and their manager (call `manager.start()` in the app)."""
    if not settings.redis_url:
        raise ConfigurationError(
            "worker pools need Redis (HYDRANT_REDIS_URL): workers and upstream servers register"
            " there"
        )
    upstream = settings.upstream_pools()
    workers = [m for m in settings.served_models() if m.name not in upstream]
    if workers and not settings.worker_secret:
        raise ConfigurationError(
            "worker pools need HYDRANT_WORKER_SECRET (shared with the workers)"
        )
    if settings.worker_stream_idle_timeout_s <= 2 * settings.worker_keepalive_s:
        raise ConfigurationError(
            "HYDRANT_WORKER_STREAM_IDLE_TIMEOUT_S must be more than two keep-alive intervals"
            " (HYDRANT_WORKER_KEEPALIVE_S), or live streams of queued requests would be cut"
        )
    if settings.worker_max_streams < 1:
        raise ConfigurationError("HYDRANT_WORKER_MAX_STREAMS must be at least 1")
    return assemble_pools(
        settings,
        WorkerDirectory.from_url(settings.redis_url, settings.worker_registry_prefix),
        settings.worker_secret or "",
        scaler or make_scaler(settings),
    )


def assemble_pools(
    settings: Settings, directory: WorkerSource, secret: str, scaler: Scaler
) -> tuple[ModelRegistry, PoolManager]:
    """The pools of `settings.served_models()`, read from `directory`, started by `scaler`."""
    http = WorkerHttp(
        secret,
        stream_idle_timeout_s=settings.worker_stream_idle_timeout_s,
        max_streams_per_worker=settings.worker_max_streams,
    )
    metrics = PoolMetrics()
    manager = PoolManager(
        directory=directory,
        http=http,
        scaler=scaler,
        metrics=metrics,
        start_workers=settings.pool_start_workers,
        poll_s=max(0.1, min(1.0, settings.worker_heartbeat_s / 2)),
        idle_check_s=max(0.2, min(5.0, settings.pool_idle_timeout_s / 4 or 5.0)),
    )
    registry = ModelRegistry()
    manager.registry = registry
    options = pool_options(settings)
    upstream = settings.upstream_pools()
    upstream_key = settings.upstream_key() if upstream else None
    for spec in settings.served_models():
        path = Path(spec.path)
        if not (path / "tokenizer.json").is_file():
            raise ConfigurationError(
                f"model {spec.name}: the gateway tokenizes, so {path} needs tokenizer.json"
            )
        info = inspect_checkpoint(path)
        backend = upstream.get(spec.name)
        if backend is None:
            pool = WorkerPool(
                spec=PoolSpec(model=spec.name, path=str(path), quantization=settings.quantization),
                http=http,
                scaler=manager.scaler,
                metrics=metrics,
                options=options,
            )
        else:
            pool = upstream_pool(settings, manager, backend.model, path, upstream_key)
        manager.pools[spec.name] = pool
        registry.add(
            ServedModel(
                name=spec.name,
                tokenizer=Tokenizer.from_pretrained(path),
                client=PoolClient(pool),
                max_model_len=info.max_model_len or DEFAULT_MAX_MODEL_LEN,
                state="pool",
                # what the workers are started with (an upstream's own: not known here)
                max_num_seqs=settings.max_num_seqs if backend is None else None,
                block_size=BLOCK_SIZE,
                tool_call_parser=settings.tool_call_parser(spec.name),
            )
        )
    return registry, manager


def upstream_pool(
    settings: Settings, manager: PoolManager, model: str, path: Path, api_key: str | None
) -> WorkerPool:
    """The pool of a model served by upstream servers, and the health checks that fill it.

    The servers' own deployment starts, scales and rolls them (or, with the kubernetes
    scaler, this gateway scales them from zero: `upstream_scaling`); the gateway routes
    to those that pass its health checks.
    """
    backend = settings.upstream_pools()[model]
    http = UpstreamHttp(
        model,
        api_key,
        manager.metrics,
        control_key=settings.upstream_control_secret() if backend.sleep else None,
    )
    if not isinstance(manager.directory, WorkerDirectory):
        raise ConfigurationError("upstream pools need the Redis worker registry")
    manager.monitors.append(
        UpstreamMonitor(
            spec=backend,
            http=http,
            store=RedisRegistryStore(
                aioredis.Redis.from_url(settings.redis_url or ""), settings.worker_registry_prefix
            ),
            interval_s=settings.upstream_health_s,
            ttl_s=max(settings.worker_heartbeat_ttl_s, 2.5 * settings.upstream_health_s),
            capacity=settings.upstream_max_inflight,
            drains=DrainMarks(
                aioredis.Redis.from_url(settings.redis_url or ""),
                f"{settings.worker_registry_prefix}:upstream-drained",
            ),
        )
    )
    scaler, options = upstream_scaling(settings, sleep=backend.sleep)
    if settings.upstream_max_inflight_tokens < 0 or settings.upstream_queue_timeout_s <= 0:
        raise ConfigurationError(
            "HYDRANT_UPSTREAM_MAX_INFLIGHT_TOKENS must be 0 (no bound) or more, and"
            " HYDRANT_UPSTREAM_QUEUE_TIMEOUT_S more than 0"
        )
    fair = None
    if settings.upstream_max_inflight_tokens > 0:
        fair = FairQueue(
            member_tokens=settings.upstream_max_inflight_tokens,
            timeout_s=settings.upstream_queue_timeout_s,
        )
    return WorkerPool(
        spec=PoolSpec(model=model, path=str(path), quantization=None),
        http=http,
        scaler=scaler,
        metrics=manager.metrics,
        options=options,
        kind=backend.kind,
        fair=fair,
    )
