"""Every service the gateway runs, built once from settings, started and stopped with the app.

`build_services` is the one place that makes them (litestar-fullstack's
shape): `create_app` hands each to the handlers by `Provide` (app.py), the
app's state holds only this object (guards, which run before injection, read
the authentication part of it through `auth.context`), and jobs and the CLI
build their parts through the same per-domain providers (`*/deps.py`).

The model registry comes from outside when engines run in this process (the
embedded default loads them with torch, which the platform never imports);
worker pools are an optional service of the same build, made here from
settings. With neither, the app serves the control plane alone (no `/v1`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from litestar import Litestar
from prometheus_client import CollectorRegistry

from hydrant.errors import ConfigurationError
from hydrant.platform.adapters.catalog import AdapterCatalog
from hydrant.platform.auth.brute_force import build_brute_force_guard
from hydrant.platform.auth.context import SERVICES_STATE_KEY, AuthContext
from hydrant.platform.auth.from_settings import build_authenticator
from hydrant.platform.auth.service import Authenticator
from hydrant.platform.batches.finish import Finisher
from hydrant.platform.batches.output import LineSealer
from hydrant.platform.batches.runner import BatchRunner
from hydrant.platform.batches.service import BatchService
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.billing.pricing import Price
from hydrant.platform.credits.service import CreditBook
from hydrant.platform.db.session import Database
from hydrant.platform.dispatch.service import PoolManager, build_pools
from hydrant.platform.files.deps import build_file_store
from hydrant.platform.files.service import FileStore
from hydrant.platform.health.service import ModelRuntime
from hydrant.platform.http.client_address import parse_trusted_proxies
from hydrant.platform.inference.abuse import AbuseGuard
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.responses.seal import ResponseSealer
from hydrant.platform.inference.responses.store import ResponseStore
from hydrant.platform.inference.service import InferenceService
from hydrant.platform.job_table import BATCH_PERIODIC, JOB_TABLE
from hydrant.platform.jobs.context import JobContext
from hydrant.platform.keys.service import store_bootstrap_key
from hydrant.platform.ledger.attribution import EndUserHasher
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.mail.mailer import Mailer, make_mailer
from hydrant.platform.metrics import GatewayMetrics
from hydrant.platform.metrics.metered_ledger import MeteredLedger
from hydrant.platform.models.deployments import PriceBook, ensure_deployments
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.quotas import GuardedQuotaBackend, InMemoryQuotaBackend, QuotaBackend
from hydrant.platform.quotas.gate import QuotaGate
from hydrant.platform.reconciliation.recorder import TimelineRecorder
from hydrant.settings import ModelSpec, Settings

log = logging.getLogger(__name__)

# How long a thread may keep the GIL while another waits for it (Python's default: 5 ms).
# Why lower: with in-process engines, the engine's step thread runs Python between its
# torch ops, and at the default the event loop waits up to 5 ms for the GIL after each
# socket read or Redis reply it wakes for; all of that wait is gateway overhead. Measured
# with bench/gateway.py (2 cores, interleaved runs): overhead p50 at 16 and 32 concurrent
# requests 20-30 % lower at 0.5 ms, throughput and concurrency 1 unchanged.
GIL_SWITCH_INTERVAL_S = 0.0005


def share_gil_with_engines() -> None:
    """Call once at process start when engines run in this process (the embedded default)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


class BackgroundService(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def make_quota_backend(settings: Settings) -> QuotaBackend:
    """Redis when configured (limits hold across gateway processes), else in this process."""
    inner: QuotaBackend
    if settings.redis_url:
        from hydrant.platform.quotas.redis_backend import RedisQuotaBackend

        if settings.quota_inline_ms < 0:
            raise ConfigurationError("HYDRANT_QUOTA_INLINE_MS must be 0 (off) or more")
        inner = RedisQuotaBackend.from_url(
            settings.redis_url,
            key_prefix="hydrant:quota",
            inline_ceiling_s=settings.quota_inline_ms / 1000,
        )
    else:
        inner = InMemoryQuotaBackend()
    return GuardedQuotaBackend(inner, settings.redis_failure_mode)


@dataclass
class InferenceServices:
    """The request path's services: quotas, prices, the ledger with its spool, `/v1`."""

    settings: Settings
    database: Database
    registry: ModelRegistry
    quota_backend: QuotaBackend
    prices: PriceBook
    spool: LedgerSpool
    ledger: DatabaseLedger
    gate: QuotaGate
    inference: InferenceService
    abuse: AbuseGuard
    responses: ResponseStore
    metered: MeteredLedger
    batches: BatchService  # `/v1/batches`
    runner: BatchRunner  # runs batches' lines through `inference`, for the batch jobs
    pools: PoolManager | None = None
    credit_book: CreditBook | None = None  # prepaid credits: admission and payment
    adapters: AdapterCatalog | None = None  # the LoRA adapters requests may name
    end_users: EndUserHasher | None = None  # the ledger's hashed end-user ids
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def api(self) -> InferenceApi:
        return InferenceApi(
            registry=self.registry,
            service=self.inference,
            abuse=self.abuse,
            responses=self.responses,
            default_max_tokens=self.settings.default_max_tokens,
            adapters=self.adapters,
            end_users=self.end_users,
        )

    @classmethod
    def build(
        cls,
        settings: Settings,
        database: Database,
        registry: ModelRegistry,
        metrics: GatewayMetrics,
        files: FileStore,
        server_secret: Callable[[], bytes],
        *,
        quota_backend: QuotaBackend | None = None,
        pools: PoolManager | None = None,
        spool_path: Path | None = None,
    ) -> InferenceServices:
        backend = quota_backend or make_quota_backend(settings)
        prices = PriceBook(database)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        spool = LedgerSpool(
            spool_path or settings.data_dir / "ledger.spool", max_bytes=settings.spool_max_bytes
        )
        device_price = DevicePrice(settings.device_price_per_hour)
        ledger = DatabaseLedger(database, spool, device_price, commit=settings.ledger_commit)
        metrics.watch_spool(spool)
        credit_book = CreditBook(database)  # prepaid plans: admission and payment from grants
        gate = QuotaGate(
            backend,
            prices,
            long_lane_slots=settings.long_lane_slots,
            long_lane_queue=settings.long_lane_queue,
            batch_lane_slots=settings.batch_lane_slots,
            batch_lane_busy_slots=settings.batch_lane_busy_slots,
            on_refusal=metrics.observe_quota_refusal,
            on_lane_wait=metrics.observe_long_lane_queue,
            on_store_admit=metrics.observe_quota_admission,
            credit_source=credit_book,
        )
        metered = MeteredLedger(ledger, metrics, prices=prices, device_price=device_price)
        inference = InferenceService(
            gate, metered, ready=ledger.ensure_recordable, after_record=credit_book.after_record
        )
        abuse = AbuseGuard(on_event=lambda event: metrics.abuse_events.labels(event).inc())
        responses = ResponseStore(
            database, settings.responses_store_days, ResponseSealer(server_secret)
        )
        adapters = AdapterCatalog(database, settings.adapter_refresh_s)
        end_users = EndUserHasher(server_secret)
        api = InferenceApi(
            registry, inference, abuse, responses, settings.default_max_tokens, adapters, end_users
        )
        lines = LineSealer(server_secret)
        if pools is not None:  # the devices they hold, for the cost reconciliation
            pools.timeline = TimelineRecorder(database)
            pools.timeline_s = settings.timeline_sample_s
        return cls(
            settings=settings,
            database=database,
            registry=registry,
            quota_backend=backend,
            prices=prices,
            spool=spool,
            ledger=ledger,
            gate=gate,
            inference=inference,
            abuse=abuse,
            responses=responses,
            metered=metered,
            batches=BatchService(
                database, files, api, backend, prices.batch, credit_source=credit_book
            ),
            runner=BatchRunner(
                database,
                files,
                api,
                ledger,
                Finisher(database, files, backend, lines),
                lines,
                metered=metered,
                quiet=gate.quiet,
                concurrency=settings.batch_lane_slots + 2,
            ),
            pools=pools,
            credit_book=credit_book,
            adapters=adapters,
            end_users=end_users,
        )

    async def start(self) -> None:
        default = Price(
            input_per_million=self.settings.price_input_per_mtok,
            output_per_million=self.settings.price_output_per_mtok,
            cached_input_per_million=self.settings.price_cached_input_per_mtok,
        )
        # Twice: gateways starting together race to create the same deployment row, and
        # the loser's IntegrityError would leave its price book empty (spend budgets not
        # enforced) until the next refresh; on the second try the row is there.
        for attempt in range(2):
            try:
                await ensure_deployments(self.database, self.settings.served_models(), default)
                await self.prices.refresh()
                if self.adapters is not None:
                    await self.adapters.refresh()
                break
            except Exception as exc:  # the database may be down at start: serve, spool, retry
                if attempt:
                    log.warning(
                        "price book not loaded at start", extra={"error": type(exc).__name__}
                    )
        self.prices.start()
        if self.adapters is not None:
            self.adapters.start()
        if self.ledger.commit == "journal":  # the journal's mover also replays what a crash left
            self._tasks.append(asyncio.create_task(self.ledger.move_journal(), name="ledger-mover"))
        else:
            self._tasks.append(asyncio.create_task(self._replay_loop(), name="spool-replay"))
        if self.pools is not None:
            await self.pools.start()

    async def _replay_loop(self, every_s: float = 5.0) -> None:
        # `size_bytes`, not `pending()`: pending reads the whole file, on the event loop.
        # Any error is logged and retried next tick: if this task died, spooled entries
        # would wait for a restart.
        while True:
            try:
                if self.spool.size_bytes:
                    replayed = await self.ledger.replay_spool()
                    if replayed:
                        log.info("spooled ledger entries replayed", extra={"entries": replayed})
            except Exception as exc:
                log.warning("spool replay failed", extra={"error": type(exc).__name__})
            await asyncio.sleep(every_s)

    async def stop_pools(self) -> None:
        if self.pools is not None:
            await self.pools.stop()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self.credit_book is not None:
            await self.credit_book.drain()
        await self.prices.stop()
        if self.adapters is not None:
            await self.adapters.stop()
        if self.spool.pending():
            with contextlib.suppress(Exception):
                await self.ledger.replay_spool()
        self.spool.close()
        await self.quota_backend.aclose()


@dataclass
class Services:
    """The app's one state object: everything a handler, a guard or a lifespan hook uses."""

    settings: Settings
    database: Database
    auth: AuthContext
    mailer: Mailer
    metrics: GatewayMetrics
    # `/metrics` renders every registry in this list at each scrape: engines add theirs.
    metric_registries: list[CollectorRegistry]
    models: tuple[ModelSpec, ...]
    files: FileStore  # `/v1/files`: uploads and batch outputs, sealed at rest
    inference: InferenceServices | None = None
    # Started after the rest, stopped before it (and before the database closes): the
    # embedded default's job scheduler (hydrant.platform.jobs.scheduler) lives here.
    background: list[BackgroundService] = field(default_factory=list)
    # Called at stop, before the request path's services stop: in-process engines.
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    @property
    def authenticator(self) -> Authenticator:
        return self.auth.authenticator

    @property
    def runtime(self) -> ModelRuntime | None:
        """What `/readyz` asks about each model (the registry, when this gateway serves)."""
        return self.inference.registry if self.inference is not None else None

    async def start(self) -> None:
        log.info("gateway starting", extra={"models": [m.name for m in self.models]})
        await self.authenticator.start()
        if self.inference is not None:
            await self.inference.start()
        for service in self.background:
            await service.start()

    async def stop(self) -> None:
        for service in reversed(self.background):
            await service.stop()
        if self.inference is not None:
            await self.inference.stop_pools()
        for hook in self.on_stop:
            await hook()
        if self.inference is not None:
            await self.inference.stop()
        await self.authenticator.stop()
        if self.auth.brute_force is not None:
            await self.auth.brute_force.aclose()
        await self.database.dispose()
        log.info("gateway stopped")


def build_services(
    settings: Settings,
    *,
    database: Database | None = None,
    registry: ModelRegistry | None = None,
    pools: PoolManager | None = None,
    models: Sequence[ModelSpec] | None = None,
    quota_backend: QuotaBackend | None = None,
    metric_registries: Sequence[CollectorRegistry] = (),
    run_jobs: bool = False,
) -> Services:
    """Build every service of a gateway from settings.

    `registry`: the embedded default's models, served by in-process engines or,
    with `pools`, by this gateway's own engine processes
    (hydrant.platform.dispatch.embedded); without one, worker pools are built when
    `HYDRANT_WORKER_POOLS` names some, and with neither the app serves no `/v1`.
    `run_jobs`: on the embedded default (no
    Redis), run the periodic jobs on the gateway's loop (`hydrant serve` does;
    tests that build an app for its routes do not).
    """
    db = database or Database(settings.effective_database_url)
    authenticator = build_authenticator(settings, db, store_bootstrap_key)
    metrics = GatewayMetrics()
    inference: InferenceServices | None = None
    own_engines = registry is not None  # in this process, or its own children
    if registry is None and settings.pool_mode:
        registry, pools = build_pools(settings)  # a ConfigurationError: a usage error (cli)

    # The authenticator's secret (resolved on first use): one read, one warning if unset.
    def server_secret() -> bytes:
        return authenticator.server_secret

    files = build_file_store(settings, db, server_secret)
    if registry is not None:
        inference = InferenceServices.build(
            settings,
            db,
            registry,
            metrics,
            files,
            server_secret,
            quota_backend=quota_backend,
            pools=pools,
        )
    # Failed key attempts per source, on the gateway's quota store (Redis: shared by all).
    brute_force = build_brute_force_guard(
        settings, inference.quota_backend if inference is not None else None
    )
    registries = [metrics.registry, brute_force.metrics.registry, *metric_registries]
    if pools is not None:
        registries.append(pools.metrics.registry)
    services = Services(
        settings=settings,
        database=db,
        auth=AuthContext(
            authenticator, brute_force, parse_trusted_proxies(settings.trusted_proxies)
        ),
        mailer=make_mailer(settings),
        metrics=metrics,
        metric_registries=registries,
        models=tuple(models if models is not None else settings.served_models()),
        files=files,
        inference=inference,
    )
    if run_jobs and settings.redis_url is None and settings.embedded_jobs:
        from hydrant.platform.jobs.scheduler import EmbeddedScheduler

        # No Celery here: the jobs run on this loop, batches' lines through this gateway.
        runner = inference.runner if inference is not None else None
        scheduler = EmbeddedScheduler(settings, db, JOB_TABLE, runtime=runner)
        if inference is not None:
            inference.batches.enqueue = scheduler.enqueue
        services.background.append(scheduler)
    elif run_jobs and settings.redis_url and inference is not None and own_engines:
        from hydrant.platform.jobs.scheduler import EmbeddedScheduler

        # Celery runs the other jobs, but its workers cannot reach engines that live in this
        # process or its children: this gateway runs its batches itself (a Celery worker's
        # run finds none).
        scheduler = EmbeddedScheduler(
            settings, db, JOB_TABLE, periodic=BATCH_PERIODIC, runtime=inference.runner
        )
        inference.batches.enqueue = scheduler.enqueue
        services.background.append(scheduler)
    return services


@contextlib.asynccontextmanager
async def open_job_runtime(ctx: JobContext) -> AsyncIterator[BatchRunner | None]:
    """What a Celery job worker runs batches' lines with: the same request path as a
    gateway's, dispatching to the worker pools (`HYDRANT_WORKER_POOLS`), which any process
    that reaches Redis can use; a pool at zero is woken by the first line. Without pools
    the engines live inside the gateways, out of a job worker's reach: None, and the
    batch jobs leave the work to a gateway's own loop."""
    settings = ctx.settings
    if not settings.pool_mode:
        yield None
        return
    # Never starts workers of its own at start: only what its lines need is woken.
    registry, pools = build_pools(replace(settings, pool_start_workers=0))
    files = build_file_store(settings, ctx.database, lambda: ctx.server_secret)
    spool = settings.data_dir / "jobs" / f"ledger-{os.getpid()}.spool"  # never the gateway's
    inference = InferenceServices.build(
        settings,
        ctx.database,
        registry,
        GatewayMetrics(),
        files,
        lambda: ctx.server_secret,
        pools=pools,
        spool_path=spool,
    )
    await inference.prices.refresh()
    if inference.adapters is not None:
        await inference.adapters.refresh()
    await pools.start()
    try:
        yield inference.runner
    finally:
        await pools.stop()
        inference.spool.close()
        await inference.quota_backend.aclose()


def services_of(app: Litestar) -> Services:
    """The services an app was built with (for tests and tools that hold only the app)."""
    services: Services = getattr(app.state, SERVICES_STATE_KEY)
    return services
