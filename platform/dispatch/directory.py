"""The gateway's read side of the worker registry in Redis.

Workers write a record with a TTL and index it in a per-model sorted set
(`hydrant.engine.worker.registration`). Reading a pool is one ZRANGE and one
MGET; index members whose record expired (a worker that stopped
heartbeating) are dropped from the index here, so they leave the pool within
the TTL plus one poll.
"""

from __future__ import annotations

import logging
from typing import Protocol

import msgspec
import redis.asyncio as aioredis

from hydrant.engine.worker.wire import (
    WorkerRecord,
    models_key,
    pool_key,
    record_decoder,
    record_key,
)

log = logging.getLogger(__name__)


class WorkerSource(Protocol):
    """What a gateway reads the registry through: Redis here, or a directory
    (file_directory.py, the embedded default's engine children)."""

    async def workers(self, model: str) -> list[WorkerRecord]: ...

    async def models(self) -> list[str]: ...

    async def aclose(self) -> None: ...


class WorkerDirectory:
    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str) -> WorkerDirectory:
        return cls(aioredis.Redis.from_url(url), prefix)

    async def workers(self, model: str) -> list[WorkerRecord]:
        """The model's live workers (records not yet expired)."""
        index = pool_key(self.prefix, model)
        ids = [
            i.decode() if isinstance(i, bytes) else str(i)
            for i in await self.client.zrange(index, 0, -1)
        ]
        if not ids:
            return []
        raw = await self.client.mget([record_key(self.prefix, i) for i in ids])
        records: list[WorkerRecord] = []
        gone: list[str] = []
        for worker_id, value in zip(ids, raw, strict=True):
            if value is None:
                gone.append(worker_id)
                continue
            try:
                records.append(record_decoder.decode(value))
            except msgspec.DecodeError:
                log.warning("unreadable worker record", extra={"worker_id": worker_id})
        if gone:
            # By name, not by expiry score: the scores are the workers' clocks, and a
            # gateway whose clock runs ahead would otherwise prune live workers.
            await self.client.zrem(index, *gone)
        return records

    async def models(self) -> list[str]:
        """Every model a worker has registered for (pools with no live worker included)."""
        names = await self.client.smembers(models_key(self.prefix))
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in names)

    async def aclose(self) -> None:
        await self.client.aclose()
