"""Health checks of upstream pool members, and their entries in the worker registry.

An upstream server cannot heartbeat into Hydrant's registry itself, so the
gateway does it for it: every `interval_s` it probes each member (`/health`,
then `/v1/models` must name the model) and, while the member passes, writes
its `WorkerRecord` (kind `openai`) with the same TTL a worker's heartbeat
has; a member that fails is removed at once. From there on everything that
reads the registry sees upstream members like workers: routing, the pool's
view in `GET /admin/pools`, preflight. Several gateways probing the same
member write the same record (its id is derived from its URL).

The load a member reports (vLLM's `/metrics`: requests running and waiting,
KV cache usage) goes into the record's stats, so least-loaded routing sees
what other gateways sent too; a server without those metrics still serves.

An admin drains a member (`POST /admin/pools/{model}/workers/{id}/drain`) as
it drains a worker: no new requests, those in flight finish. A worker drains
itself and publishes `draining`; an upstream server cannot, so the drain is a
mark in Redis (`DrainMarks`) that every gateway's monitor reads each round and
publishes the member's record as `draining` while it stands.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import msgspec
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from hydrant.engine.protocol import EngineStats
from hydrant.engine.worker.registration import RegistryStore
from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.upstream_http import UpstreamHttp
from hydrant.settings import UpstreamSpec

log = logging.getLogger(__name__)

UPSTREAM_DEVICE = "upstream"  # a record's `device`: the member runs on devices of its own


def member_id(kind: str, url: str) -> str:
    """A member's registry id: stable for its URL, so every gateway writes the same record."""
    return f"{kind}-{hashlib.blake2b(url.encode(), digest_size=6).hexdigest()}"


_LOAD = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
_LOAD_PREFIX = "vllm:"


def stats_of(metrics_text: str, model: str) -> EngineStats | None:
    """The load vLLM's `/metrics` reports for `model` (None when it reports none)."""
    values: dict[str, float] = {}
    # Only the three gauges' lines are parsed: the whole text (histograms included) is ~50 kB,
    # ~13 ms of the gateway's event loop every probe where these few lines take well under 1.
    lines = [
        line
        for line in metrics_text.splitlines()
        if line.startswith(_LOAD_PREFIX) and line.partition("{")[0].partition(" ")[0] in _LOAD
    ]
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.labels.get("model_name", model) == model:
                values[family.name] = values.get(family.name, 0.0) + sample.value
    if "vllm:num_requests_running" not in values:
        return None
    return EngineStats(
        num_running=int(values["vllm:num_requests_running"]),
        num_waiting=int(values.get("vllm:num_requests_waiting", 0)),
        kv_usage=values.get("vllm:kv_cache_usage_perc", 0.0),
        num_free_blocks=0,
        num_total_blocks=0,
        prefix_cache_hit_rate=0.0,
    )


def served_entry(models_body: Any, model: str) -> dict[str, Any] | None:
    """The `/v1/models` entry whose id is `model`, if the server serves it."""
    data = models_body.get("data") if isinstance(models_body, dict) else None
    for entry in data if isinstance(data, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            return entry
    return None


@dataclass
class DrainMarks:
    """The upstream members an admin drained: one Redis set, so every gateway follows."""

    client: aioredis.Redis
    key: str

    async def members(self) -> set[str]:
        return {
            m.decode() if isinstance(m, bytes) else str(m)
            for m in await self.client.smembers(self.key)
        }

    async def mark(self, worker_id: str) -> None:
        await self.client.sadd(self.key, worker_id)

    async def clear(self, worker_id: str) -> None:
        await self.client.srem(self.key, worker_id)

    async def aclose(self) -> None:
        await self.client.aclose()


@dataclass
class UpstreamMonitor:
    """Probes one upstream pool's members and keeps their registry records."""

    spec: UpstreamSpec
    http: UpstreamHttp
    store: RegistryStore
    interval_s: float = 2.0
    ttl_s: float = 5.0
    capacity: int = 256
    probe_timeout_s: float = 3.0
    drains: DrainMarks | None = None
    _first_seen: dict[str, float] = field(default_factory=dict)
    _healthy: dict[str, bool] = field(default_factory=dict)
    _busy_at: dict[str, float] = field(default_factory=dict)

    async def _serving(self, url: str) -> tuple[dict[str, Any], EngineStats | None] | str:
        """The member's `/v1/models` entry and load when it serves the model, else why not."""
        try:
            health = await self.http.get(f"{url}/health", self.probe_timeout_s)
            if health.status_code != 200:
                return f"/health answered {health.status_code}"
            models = await self.http.get(f"{url}/v1/models", self.probe_timeout_s)
            if models.status_code != 200:
                return f"/v1/models answered {models.status_code}"
            entry = served_entry(models.json(), self.spec.model)
            if entry is None:
                return "/v1/models does not list the model"
        except (httpx.HTTPError, ValueError) as exc:
            return type(exc).__name__
        stats = None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            metrics = await self.http.get(f"{url}/metrics", self.probe_timeout_s)
            if metrics.status_code == 200:
                stats = stats_of(metrics.text, self.spec.model)
        return entry, stats

    async def probe(self, url: str) -> WorkerRecord | None:
        """The member's record when it serves the model now, else None (the change logged)."""
        serving = await self._serving(url)
        if isinstance(serving, str):
            if self._healthy.get(url, True):
                log.warning(
                    "upstream member down",
                    extra={"model": self.spec.model, "address": url, "reason": serving},
                )
            self._healthy[url] = False
            self._first_seen.pop(url, None)
            self._busy_at.pop(url, None)
            return None
        entry, stats = serving
        now = time.time()
        if not self._healthy.get(url):
            log.info("upstream member up", extra={"model": self.spec.model, "address": url})
        self._healthy[url] = True
        started = self._first_seen.setdefault(url, now)
        if stats is None or stats.num_running + stats.num_waiting > 0:
            self._busy_at[url] = now  # unknown load counts as busy: never idled on a guess
        return WorkerRecord(
            worker_id=member_id(self.spec.kind, url),
            model=self.spec.model,
            address=url,
            device=UPSTREAM_DEVICE,
            state="ready",
            path=str(entry.get("root") or url),
            kind=self.spec.kind,
            capacity=self.capacity,
            max_model_len=int(entry.get("max_model_len") or 0),
            stats=stats,
            started_at=started,
            heartbeat_at=now,
            # when the server last had requests (as this probe saw it, every gateway's): the
            # idle time a scale to zero waits on (scale_down.idle_past), like a worker's
            idle_since=self._busy_at.get(url, started),
        )

    async def check(self) -> None:
        """One round: every member probed at once, its record written or removed."""
        records = await asyncio.gather(*(self.probe(url) for url in self.spec.urls))
        drained = await self.drains.members() if self.drains is not None else set()
        for url, record in zip(self.spec.urls, records, strict=True):
            if record is not None:
                if record.worker_id in drained:
                    record = msgspec.structs.replace(record, state="draining")
                await self.store.publish(record, self.ttl_s)
            else:
                await self.store.remove(self._placeholder(url))

    def _placeholder(self, url: str) -> WorkerRecord:
        """What `remove` needs to find a member's record: its id and model."""
        return WorkerRecord(
            worker_id=member_id(self.spec.kind, url),
            model=self.spec.model,
            address=url,
            device=UPSTREAM_DEVICE,
            state="unloaded",
            path=url,
            kind=self.spec.kind,
        )

    async def drain(self, worker_id: str, drained: bool = True) -> None:
        """Mark (or unmark) a member drained for every gateway, and publish it now."""
        if self.drains is None:
            raise RuntimeError("this monitor keeps no drain marks")
        await (self.drains.mark(worker_id) if drained else self.drains.clear(worker_id))
        await self.check()

    async def run(self) -> None:
        while True:
            try:
                await self.check()
            except Exception as exc:  # Redis away: keep probing, the TTL covers the gap
                log.warning(
                    "upstream health round failed",
                    extra={"model": self.spec.model, "error": type(exc).__name__},
                )
            await asyncio.sleep(self.interval_s)
