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

Where the pool sleeps (`HYDRANT_UPSTREAM_SLEEP`: vLLM's sleep mode), a
sleeping vLLM still passes `/health` and lists the model, so each round also
asks `/is_sleeping`: a sleeping member is published `sleeping`, kept in the
pool, and the first request wakes it (`WorkerPool._wake_up`) instead of
finding no member. A member that does not answer it (vLLM without
`VLLM_SERVER_DEV_MODE=1`) is published `ready` and the change logged.
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
from hydrant.engine.worker.wire import WorkerRecord, WorkerState
from hydrant.platform.dispatch.upstream_http import UpstreamHttp
from hydrant.settings import UpstreamSpec

log = logging.getLogger(__name__)

UPSTREAM_DEVICE = "upstream"  # a record's `device`: the member runs on devices of its own


def member_id(kind: str, url: str) -> str:
    """A member's registry id: stable for its URL, so every gateway writes the same record."""
    return f"{kind}-{hashlib.blake2b(url.encode(), digest_size=6).hexdigest()}"


# The load gauges of a member's `/metrics`: vLLM's (label `model_name`), or a Hydrant
# upstream's engine gauges (label `model`), in the order running, waiting, KV usage.
_LOADS = {
    "vllm:": (
        ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"),
        "model_name",
    ),
    "hydrant_": (
        (
            "hydrant_num_requests_running",
            "hydrant_num_requests_waiting",
            "hydrant_kv_cache_usage_perc",
        ),
        "model",
    ),
}


def stats_of(metrics_text: str, model: str) -> EngineStats | None:
    """The load a member's `/metrics` reports for `model` (None when it reports none)."""
    for prefix, (names, label) in _LOADS.items():
        values = _gauges(metrics_text, prefix, names, label, model)
        if names[0] in values:
            break
    else:
        return None
    running, waiting, kv_usage = names
    return EngineStats(
        num_running=int(values[running]),
        num_waiting=int(values.get(waiting, 0)),
        kv_usage=values.get(kv_usage, 0.0),
        num_free_blocks=0,
        num_total_blocks=0,
        prefix_cache_hit_rate=0.0,
    )


def _gauges(
    metrics_text: str, prefix: str, names: tuple[str, ...], label: str, model: str
) -> dict[str, float]:
    """The gauges `names` for `model`, summed over their other labels."""
    values: dict[str, float] = {}
    # Only the gauges' lines are parsed: the whole text (histograms included) is ~50 kB,
    # ~13 ms of the gateway's event loop every probe where these few lines take well under 1.
    lines = [
        line
        for line in metrics_text.splitlines()
        if line.startswith(prefix) and line.partition("{")[0].partition(" ")[0] in names
    ]
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if sample.labels.get(label, model) == model:
                values[family.name] = values.get(family.name, 0.0) + sample.value
    return values


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
    # The state each member was last published in, and since when (a record's `state_since`)
    _states: dict[str, tuple[WorkerState, float]] = field(default_factory=dict)
    _says_sleep: dict[str, bool] = field(default_factory=dict)  # answers `/is_sleeping`

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
            self._states.pop(url, None)
            return None
        entry, stats = serving
        now = time.time()  # before the sleep probe: a state seen then is no newer than this
        state = await self._sleep_state(url)
        if not self._healthy.get(url):
            log.info("upstream member up", extra={"model": self.spec.model, "address": url})
        self._healthy[url] = True
        started = self._first_seen.setdefault(url, now)
        if stats is None or stats.num_running + stats.num_waiting > 0:
            self._busy_at[url] = now  # unknown load counts as busy: never idled on a guess
        last = self._states.get(url)
        since = last[1] if last is not None and last[0] == state else now
        self._states[url] = (state, since)
        return WorkerRecord(
            worker_id=member_id(self.spec.kind, url),
            model=self.spec.model,
            address=url,
            device=UPSTREAM_DEVICE,
            state=state,
            state_since=since,
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

    async def _sleep_state(self, url: str) -> WorkerState:
        """`sleeping` when the member says so (pools that sleep only), else `ready`."""
        if not self.spec.sleep:
            return "ready"
        sleeping = await self.http.is_sleeping(url, self.probe_timeout_s)
        says = sleeping is not None
        if self._says_sleep.get(url) != says:
            (log.info if says else log.warning)(
                "upstream member answers /is_sleeping"
                if says
                else "upstream member does not answer /is_sleeping: its sleep is not seen"
                " (vLLM needs VLLM_SERVER_DEV_MODE=1 and --enable-sleep-mode)",
                extra={"model": self.spec.model, "address": url},
            )
            self._says_sleep[url] = says
        return "sleeping" if sleeping else "ready"

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
