"""The gateway's services built from settings, and their start and stop.

Everything the request path needs (price book, quota gate, ledger with its
spool, the inference service) is made here once per process and handed to
the app; the model registry comes from outside (in-process engines on the
embedded default, worker pools otherwise), since the platform never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from dataclasses import dataclass, field
from typing import Protocol

from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.billing.pricing import Price
from hydrant.platform.db.session import Database
from hydrant.platform.inference.abuse import AbuseGuard
from hydrant.platform.inference.quota_gate import QuotaGate
from hydrant.platform.inference.service import InferenceService
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.metrics import GatewayMetrics
from hydrant.platform.metrics.metered_ledger import MeteredLedger
from hydrant.platform.models.deployments import PriceBook, ensure_deployments
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.quotas import GuardedQuotaBackend, InMemoryQuotaBackend, QuotaBackend
from hydrant.settings import Settings

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

        inner = RedisQuotaBackend.from_url(settings.redis_url, key_prefix="hydrant:quota")
    else:
        inner = InMemoryQuotaBackend()
    return GuardedQuotaBackend(inner, settings.redis_failure_mode)


@dataclass
class Gateway:
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
    metrics: GatewayMetrics
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # Started after the gateway, stopped before it (and before the database closes): the
    # embedded default's job scheduler (hydrant.platform.jobs.scheduler) lives here.
    background: list[BackgroundService] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        settings: Settings,
        database: Database,
        registry: ModelRegistry,
        quota_backend: QuotaBackend | None = None,
    ) -> Gateway:
        backend = quota_backend or make_quota_backend(settings)
        prices = PriceBook(database)
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        spool = LedgerSpool(settings.data_dir / "ledger.spool", max_bytes=settings.spool_max_bytes)
        device_price = DevicePrice(settings.device_price_per_hour)
        ledger = DatabaseLedger(database, spool, device_price, commit=settings.ledger_commit)
        metrics = GatewayMetrics()
        metrics.watch_spool(spool)
        gate = QuotaGate(
            backend,
            prices,
            long_lane_slots=settings.long_lane_slots,
            long_lane_queue=settings.long_lane_queue,
            on_refusal=metrics.observe_quota_refusal,
            on_lane_wait=metrics.observe_long_lane_queue,
        )
        metered = MeteredLedger(ledger, metrics, prices=prices, device_price=device_price)
        return cls(
            settings=settings,
            database=database,
            registry=registry,
            quota_backend=backend,
            prices=prices,
            spool=spool,
            ledger=ledger,
            gate=gate,
            inference=InferenceService(gate, metered, ready=ledger.ensure_recordable),
            abuse=AbuseGuard(on_event=lambda event: metrics.abuse_events.labels(event).inc()),
            metrics=metrics,
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
                break
            except Exception as exc:  # the database may be down at start: serve, spool, retry
                if attempt:
                    log.warning(
                        "price book not loaded at start", extra={"error": type(exc).__name__}
                    )
        self.prices.start()
        if self.ledger.commit == "journal":  # the journal's mover also replays what a crash left
            self._tasks.append(asyncio.create_task(self.ledger.move_journal(), name="ledger-mover"))
        else:
            self._tasks.append(asyncio.create_task(self._replay_loop(), name="spool-replay"))
        for service in self.background:
            await service.start()

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

    async def stop(self) -> None:
        for service in reversed(self.background):
            await service.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self.prices.stop()
        if self.spool.pending():
            with contextlib.suppress(Exception):
                await self.ledger.replay_spool()
        self.spool.close()
        await self.quota_backend.aclose()
