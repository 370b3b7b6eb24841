"""A worker's Redis registry entry: written at start, refreshed by a heartbeat, deleted on exit.

The record key carries a TTL a few heartbeats long, so a worker that dies
without deregistering (SIGKILL, a lost node) disappears from the registry on
its own; the per-model sorted set is only an index, scored by expiry, and
readers drop members whose record is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import redis.asyncio as aioredis

from hydrant.engine.worker.wire import (
    WorkerRecord,
    models_key,
    pool_key,
    record_encoder,
    record_key,
)

log = logging.getLogger(__name__)


class Registration:
    def __init__(
        self,
        client: aioredis.Redis,
        prefix: str,
        snapshot: Callable[[], WorkerRecord],
        interval_s: float,
        ttl_s: float,
    ) -> None:
        if ttl_s <= interval_s:
            raise ValueError("the heartbeat TTL must be longer than its interval")
        self.client = client
        self.prefix = prefix
        self.snapshot = snapshot
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._task: asyncio.Task[None] | None = None
        self._beat = asyncio.Event()

    async def publish(self) -> None:
        """Write the current record now (state changes are published at once, not next beat)."""
        record = self.snapshot()
        now = time.time()
        ttl_ms = int(self.ttl_s * 1000)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(
            record_key(self.prefix, record.worker_id), record_encoder.encode(record), px=ttl_ms
        )
        pipe.zadd(pool_key(self.prefix, record.model), {record.worker_id: now * 1000 + ttl_ms})
        pipe.sadd(models_key(self.prefix), record.model)
        await pipe.execute()

    def beat_now(self) -> None:
        self._beat.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="worker-heartbeat")

    async def _loop(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception as exc:  # Redis away: keep serving, keep trying
                log.warning("heartbeat failed", extra={"error": type(exc).__name__})
            self._beat.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._beat.wait(), self.interval_s)

    async def deregister(self) -> None:
        """Stop the heartbeat and remove the record, so the gateway forgets us at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        record = self.snapshot()
        try:
            pipe = self.client.pipeline(transaction=True)
            pipe.delete(record_key(self.prefix, record.worker_id))
            pipe.zrem(pool_key(self.prefix, record.model), record.worker_id)
            await pipe.execute()
        except Exception as exc:  # the TTL removes it anyway
            log.warning("deregistration failed", extra={"error": type(exc).__name__})
