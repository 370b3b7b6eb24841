"""What the gateway exports to Prometheus: traffic, tokens, money, refusals, latencies, spool.

Money is counted in integer micro-units (`to_micro_units`, the ledger's own
rounding), never as a float sum of amounts: a Prometheus sample is a float64,
which holds every integer below 2**53 exactly (9 billion currency units in
micro-units), whereas adding 0.1-style amounts as floats drifts from the first
addition. These counters are for dashboards and alerts; the ledger, in
`NUMERIC`, stays the source of truth for what anyone is billed.

Labels are tenant id, model name, status or reason: never a key, a prompt or
anything a client typed. One `GatewayMetrics` per registry (Prometheus refuses
two metric families of one name in a registry).
"""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from hydrant.platform.billing.money import to_micro_units

# Long-lane requests may wait up to the lane's timeout (30 s by default).
QUEUE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)
# Time the gateway adds around the engine: auth, tokenizing, quotas, dispatch, streaming.
OVERHEAD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# A quota store's answer to an admission: a Redis script's round trip, sub-millisecond when well.
ADMISSION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.0)


class SpoolLike(Protocol):
    """What the spool depth gauge reads of a `LedgerSpool`."""

    @property
    def size_bytes(self) -> int: ...

    def pending(self) -> int: ...


class SpoolDepth:
    """Counts spooled entries for a scrape, recounting only when the spool's size changed.

    Why cache: `pending()` reads the whole file; the spool is empty (size 0, no
    read) while the database is up and grows only during an outage.
    """

    def __init__(self, spool: SpoolLike) -> None:
        self._spool = spool
        self._lock = threading.Lock()
        self._size = 0
        self._count = 0

    def __call__(self) -> float:
        size = self._spool.size_bytes
        with self._lock:
            if size == 0:
                self._size, self._count = 0, 0
            elif size != self._size:
                self._count = self._spool.pending()
                self._size = size
            return float(self._count)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        tenant_model = ["tenant", "model"]
        self.requests = Counter(
            "hydrant_gateway_requests",
            "Requests that reached the ledger, by outcome status.",
            ["tenant", "model", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "hydrant_gateway_prompt_tokens", "Prompt tokens billed.", tenant_model, registry=r
        )
        self.cached_prompt_tokens = Counter(
            "hydrant_gateway_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache (billed at the cached rate).",
            tenant_model,
            registry=r,
        )
        self.completion_tokens = Counter(
            "hydrant_gateway_completion_tokens",
            "Completion tokens billed.",
            tenant_model,
            registry=r,
        )
        self.device_seconds = Counter(
            "hydrant_gateway_device_seconds",
            "Device time apportioned to requests by the engine.",
            tenant_model,
            registry=r,
        )
        self.charged_micros = Counter(
            "hydrant_gateway_charged_micro_units",
            "Money charged, in micro-units of the currency (1e-6); the ledger is authoritative.",
            tenant_model,
            registry=r,
        )
        self.device_cost_micros = Counter(
            "hydrant_gateway_device_cost_micro_units",
            "Device cost of requests, in micro-units of the currency (1e-6).",
            tenant_model,
            registry=r,
        )
        self.quota_refusals = Counter(
            "hydrant_quota_refusals",
            "Requests refused by quotas and budgets, by reason.",
            ["tenant", "reason"],
            registry=r,
        )
        self.long_lane_queue = Histogram(
            "hydrant_long_lane_queue_seconds",
            "Time long-lane requests waited for admission.",
            ["model"],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.quota_admission = Histogram(
            "hydrant_quota_admission_seconds",
            "Time a request waited for the quota store to admit it (a Redis script's round trip,"
            " with the event loop's queue when not called inline).",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "hydrant_gateway_overhead_seconds",
            "Time a request spent in the gateway outside the engine.",
            ["model"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.abuse_events = Counter(
            "hydrant_abuse_events",
            "Prompts refused as special-token floods, and sources blocked for them, by event.",
            ["event"],
            registry=r,
        )
        self.spool_entries = Gauge(
            "hydrant_ledger_spool_entries",
            "Ledger entries waiting in the local spool for the database.",
            registry=r,
        )
        # process_resident_memory_bytes & co.: the soak bench and preflight watch RSS through it.
        ProcessCollector(registry=r)

    def observe_request(
        self,
        tenant: str,
        model: str,
        status: str,
        *,
        prompt_tokens: int = 0,
        cached_tokens: int = 0,
        completion_tokens: int = 0,
        device_seconds: float = 0.0,
    ) -> None:
        """One request's outcome and usage (what its ledger entry counts)."""
        for name, value in (
            ("prompt_tokens", prompt_tokens),
            ("cached_tokens", cached_tokens),
            ("completion_tokens", completion_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int")
        self.requests.labels(tenant, model, status).inc()
        self.prompt_tokens.labels(tenant, model).inc(prompt_tokens)
        self.cached_prompt_tokens.labels(tenant, model).inc(cached_tokens)
        self.completion_tokens.labels(tenant, model).inc(completion_tokens)
        if device_seconds > 0:
            self.device_seconds.labels(tenant, model).inc(device_seconds)

    def observe_charge(
        self, tenant: str, model: str, charged: Decimal, device_cost: Decimal = Decimal(0)
    ) -> None:
        """A priced entry's money (Decimal only; a float raises TypeError)."""
        charged_micros = to_micro_units(charged)
        cost_micros = to_micro_units(device_cost)
        if charged_micros < 0 or cost_micros < 0:
            raise ValueError("charges and costs are never negative")
        self.charged_micros.labels(tenant, model).inc(charged_micros)
        self.device_cost_micros.labels(tenant, model).inc(cost_micros)

    def observe_quota_refusal(self, tenant: str, reason: str) -> None:
        self.quota_refusals.labels(tenant, reason).inc()

    def observe_long_lane_queue(self, model: str, seconds: float) -> None:
        self.long_lane_queue.labels(model).observe(max(0.0, seconds))

    def observe_quota_admission(self, seconds: float) -> None:
        self.quota_admission.observe(max(0.0, seconds))

    def observe_overhead(self, model: str, seconds: float) -> None:
        self.overhead.labels(model).observe(max(0.0, seconds))

    def set_spool_depth(self, entries: int) -> None:
        self.spool_entries.set(entries)

    def watch_spool(self, spool: SpoolLike) -> None:
        """Read the spool's depth at each scrape (instead of `set_spool_depth` calls)."""
        self.spool_entries.set_function(SpoolDepth(spool))
