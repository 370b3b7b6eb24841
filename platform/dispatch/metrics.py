"""The pools' autoscaling signals, exported by the gateway.

An external autoscaler (KEDA, an HPA on custom metrics) must be able to
scale a pool up from zero, when there is no worker whose own metrics it
could read: so the queue and in-flight numbers come from the gateway. The
gauges are read from the pools at each scrape (a collector, not counters
kept in step by hand); wakes and retries are counted as they happen.
The names are referenced by infra/ (PrometheusRule, KEDA, Grafana).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from hydrant.engine.worker.wire import WORKER_STATES

WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
PUBLISHED_STATES = ("ready", "starting", "sleeping", "draining")


@dataclass
class PoolSnapshot:
    model: str
    replicas: dict[str, int] = field(default_factory=dict)  # by state
    waiting: int = 0
    inflight: int = 0
    inflight_tokens: int = 0


class _PoolCollector:
    def __init__(self, source: Callable[[], Iterable[PoolSnapshot]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        replicas = GaugeMetricFamily(
            "hydrant_pool_replicas", "Workers of the pool, by state.", labels=["model", "state"]
        )
        waiting = GaugeMetricFamily(
            "hydrant_pool_waiting_requests",
            "Requests waiting for a ready worker (including during a wake).",
            labels=["model"],
        )
        inflight = GaugeMetricFamily(
            "hydrant_pool_inflight_requests",
            "Requests dispatched to the pool's workers and not finished.",
            labels=["model"],
        )
        tokens = GaugeMetricFamily(
            "hydrant_pool_inflight_tokens",
            "Prompt plus maximum new tokens of the requests in flight.",
            labels=["model"],
        )
        for snap in self._source():
            for state in PUBLISHED_STATES:
                replicas.add_metric([snap.model, state], snap.replicas.get(state, 0))
            waiting.add_metric([snap.model], snap.waiting)
            inflight.add_metric([snap.model], snap.inflight)
            tokens.add_metric([snap.model], snap.inflight_tokens)
        yield from (replicas, waiting, inflight, tokens)


class PoolMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.wakes = Counter(
            "hydrant_pool_wakes", "Wakes of a pool from zero.", ["model"], registry=self.registry
        )
        self.wake_seconds = Histogram(
            "hydrant_pool_wake_seconds",
            "Time from a wake's start to the first ready worker.",
            ["model"],
            buckets=WAKE_BUCKETS,
            registry=self.registry,
        )
        self.retries = Counter(
            "hydrant_dispatch_retries",
            "Requests sent to another worker after one failed or refused them before any token.",
            ["model", "reason"],
            registry=self.registry,
        )
        self.usage_mismatches = Counter(
            "hydrant_upstream_usage_mismatches",
            "Upstream requests whose reported usage differs from the gateway's own count.",
            ["model", "field"],
            registry=self.registry,
        )

    def watch(self, source: Callable[[], Iterable[PoolSnapshot]]) -> None:
        self.registry.register(_PoolCollector(source))


__all__ = ["PUBLISHED_STATES", "WORKER_STATES", "PoolMetrics", "PoolSnapshot"]
