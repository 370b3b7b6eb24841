"""A worker's registry entry: written at start, refreshed by a heartbeat, deleted on exit.

Two stores, one record (`WorkerRecord`). In Redis (worker pools) the record
key carries a TTL a few heartbeats long, so a worker that dies without
deregistering (SIGKILL, a lost node) disappears from the registry on its own;
the per-model sorted set is only an index, scored by expiry, and readers drop
members whose record is gone. In a directory (`hydrant serve`'s own engine
children on the embedded default, which has no Redis) the record is one JSON
file per worker, replaced atomically at each heartbeat; readers expire it by
the age of its `heartbeat_at` (hydrant.platform.dispatch.file_directory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis.asyncio as aioredis

from hydrant.engine.worker.wire import (
    WorkerRecord,
    models_key,
    pool_key,
    record_encoder,
    record_key,
)

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".json"  # a directory registry's record files: `<worker_id>.json`


class RegistryStore(Protocol):
    """Where a worker's record is written: Redis, or a directory on this machine."""

    async def publish(self, record: WorkerRecord, ttl_s: float) -> None: ...

    async def remove(self, record: WorkerRecord) -> None: ...

    async def aclose(self) -> None: ...


class RedisRegistryStore:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    async def publish(self, record: WorkerRecord, ttl_s: float) -> None:
        now = time.time()
        ttl_ms = int(ttl_s * 1000)
        pipe = self.client.pipeline(transaction=True)
        pipe.set(
            record_key(self.prefix, record.worker_id), record_encoder.encode(record), px=ttl_ms
        )
        pipe.zadd(pool_key(self.prefix, record.model), {record.worker_id: now * 1000 + ttl_ms})
        pipe.sadd(models_key(self.prefix), record.model)
        await pipe.execute()

    async def remove(self, record: WorkerRecord) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(record_key(self.prefix, record.worker_id))
        pipe.zrem(pool_key(self.prefix, record.model), record.worker_id)
        await pipe.execute()

    async def aclose(self) -> None:
        await self.client.aclose()


class DirectoryRegistryStore:
    """One JSON file per worker in `directory`, for a gateway on the same machine.

    Each heartbeat writes a temporary file and renames it over the record
    (`os.replace` is atomic on one filesystem), so a reader sees the old record
    or the new one, never half of one. The expiry is the reader's: a record
    whose `heartbeat_at` is older than the TTL is a worker that stopped.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path_of(self, worker_id: str) -> Path:
        return self.directory / f"{worker_id}{RECORD_SUFFIX}"

    def _write(self, record: WorkerRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path_of(record.worker_id)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_bytes(record_encoder.encode(record))
        os.replace(temporary, target)

    async def publish(self, record: WorkerRecord, ttl_s: float) -> None:
        # A few hundred bytes on a local disk: no thread needed.
        self._write(record)

    async def remove(self, record: WorkerRecord) -> None:
        self.path_of(record.worker_id).unlink(missing_ok=True)

    async def aclose(self) -> None:
        return None


@dataclass(frozen=True)
class RegistryTarget:
    """Where a worker registers: a directory when one is given, else Redis."""

    redis_url: str | None = None
    prefix: str = "hydrant:workers"
    directory: Path | None = None

    def open(self) -> RegistryStore:
        if self.directory is not None:
            return DirectoryRegistryStore(self.directory)
        if not self.redis_url:
            raise ValueError("a worker registers in Redis or in a directory: neither is set")
        return RedisRegistryStore(aioredis.Redis.from_url(self.redis_url), self.prefix)


class Registration:
    def __init__(
        self,
        store: RegistryStore,
        snapshot: Callable[[], WorkerRecord],
        interval_s: float,
        ttl_s: float,
    ) -> None:
        if ttl_s <= interval_s:
            raise ValueError("the heartbeat TTL must be longer than its interval")
        self.store = store
        self.snapshot = snapshot
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._task: asyncio.Task[None] | None = None
        self._beat = asyncio.Event()

    async def publish(self) -> None:
        """Write the current record now (state changes are published at once, not next beat)."""
        await self.store.publish(self.snapshot(), self.ttl_s)

    def beat_now(self) -> None:
        self._beat.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="worker-heartbeat")

    async def _loop(self) -> None:
        while True:
            try:
                await self.publish()
            except Exception as exc:  # Redis away, disk full: keep serving, keep trying
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
        try:
            await self.store.remove(self.snapshot())
        except Exception as exc:  # the TTL removes it anyway
            log.warning("deregistration failed", extra={"error": type(exc).__name__})
