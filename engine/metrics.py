"""The engine's Prometheus metrics, named and meant as vLLM's (with a `hydrant_` prefix).

Dashboards and autoscaling rules written for vLLM (`vllm:num_requests_running`,
`vllm:gpu_cache_usage_perc`, TTFT histograms) carry over by renaming the
prefix. Every series has a `model` label, so several engines in one process
can share a registry: the metric families are created once per registry and
each `EngineMetrics` binds its own label value.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                   1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
BATCH_TOKEN_BUCKETS = tuple(float(2**i) for i in range(15))  # 1 .. 16384


class FinishedRequestTimes(Protocol):
    """What `observe_finished` reads: the fields of `outputs.RequestMetrics`."""

    @property
    def arrival_time(self) -> float: ...
    @property
    def first_scheduled_time(self) -> float | None: ...
    @property
    def first_token_time(self) -> float | None: ...
    @property
    def finish_time(self) -> float | None: ...
    @property
    def completion_tokens(self) -> int: ...


@dataclass(frozen=True)
class _Families:
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    prefix_queries: Counter
    prefix_hits: Counter
    preemptions: Counter
    prompt_tokens: Counter
    generation_tokens: Counter
    ttft: Histogram
    itl: Histogram
    queue_time: Histogram
    e2e: Histogram
    batch_tokens: Histogram


def _create_families(registry: CollectorRegistry) -> _Families:
    labels = ("model",)

    def gauge(name: str, doc: str) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    def counter(name: str, doc: str) -> Counter:
        return Counter(name, doc, labels, registry=registry)

    def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        return Histogram(name, doc, labels, registry=registry, buckets=buckets)

    return _Families(
        running=gauge("hydrant_num_requests_running", "Requests in the running batch."),
        waiting=gauge("hydrant_num_requests_waiting", "Requests waiting to be scheduled."),
        kv_usage=gauge("hydrant_kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1)."),
        prefix_queries=counter(
            "hydrant_prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        ),
        prefix_hits=counter("hydrant_prefix_cache_hits", "Prompt tokens found in the cache."),
        preemptions=counter("hydrant_num_preemptions", "Sequences preempted (no KV blocks)."),
        prompt_tokens=counter("hydrant_prompt_tokens", "Prompt tokens processed."),
        generation_tokens=counter("hydrant_generation_tokens", "Tokens generated."),
        ttft=histogram(
            "hydrant_time_to_first_token_seconds", "Arrival to first token.", LATENCY_BUCKETS
        ),
        itl=histogram(
            "hydrant_inter_token_latency_seconds", "Mean time between output tokens.", ITL_BUCKETS
        ),
        queue_time=histogram(
            "hydrant_request_queue_time_seconds", "Arrival to first schedule.", REQUEST_BUCKETS
        ),
        e2e=histogram("hydrant_e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS),
        batch_tokens=histogram(
            "hydrant_batch_tokens_per_step", "Tokens computed per engine step.", BATCH_TOKEN_BUCKETS
        ),
    )


_families_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = (
    weakref.WeakKeyDictionary()
)
_families_lock = threading.Lock()


def _families_for(registry: CollectorRegistry) -> _Families:
    with _families_lock:
        families = _families_by_registry.get(registry)
        if families is None:
            families = _create_families(registry)
            _families_by_registry[registry] = families
        return families


class EngineMetrics:
    """One engine's view of the metrics; `registry=None` uses prometheus_client's global one."""

    def __init__(self, registry: CollectorRegistry | None = None, model: str = "") -> None:
        families = _families_for(registry if registry is not None else REGISTRY)
        self.model = model
        self._running = families.running.labels(model)
        self._waiting = families.waiting.labels(model)
        self._kv_usage = families.kv_usage.labels(model)
        self._prefix_queries = families.prefix_queries.labels(model)
        self._prefix_hits = families.prefix_hits.labels(model)
        self._preemptions = families.preemptions.labels(model)
        self._prompt_tokens = families.prompt_tokens.labels(model)
        self._generation_tokens = families.generation_tokens.labels(model)
        self._ttft = families.ttft.labels(model)
        self._itl = families.itl.labels(model)
        self._queue_time = families.queue_time.labels(model)
        self._e2e = families.e2e.labels(model)
        self._batch_tokens = families.batch_tokens.labels(model)

    def observe_step(
        self, num_running: int, num_waiting: int, kv_usage: float, num_batched_tokens: int
    ) -> None:
        """Called once per engine step with the scheduler's state after it."""
        self._running.set(num_running)
        self._waiting.set(num_waiting)
        self._kv_usage.set(min(max(kv_usage, 0.0), 1.0))
        if num_batched_tokens > 0:
            self._batch_tokens.observe(num_batched_tokens)

    def observe_finished(self, output: FinishedRequestTimes) -> None:
        """Latencies of a finished request; a time that never happened (abort) is skipped.

        The inter-token latency is observed once per request, as the mean gap
        between its output tokens, since per-token times are not kept. A request that
        generated nothing (an embedding, a prompt scored with `max_tokens: 0`) has no
        first token: its time is in the end-to-end latency only, so a large embedding
        batch cannot set off a TTFT alert meant for chat users.
        """
        arrival = output.arrival_time
        if output.first_scheduled_time is not None:
            self._queue_time.observe(max(output.first_scheduled_time - arrival, 0.0))
        if output.first_token_time is not None and output.completion_tokens > 0:
            self._ttft.observe(max(output.first_token_time - arrival, 0.0))
        if output.finish_time is not None:
            self._e2e.observe(max(output.finish_time - arrival, 0.0))
            if output.first_token_time is not None and output.completion_tokens > 1:
                gap = (output.finish_time - output.first_token_time) / (
                    output.completion_tokens - 1
                )
                self._itl.observe(max(gap, 0.0))

    def record_preemption(self, n: int = 1) -> None:
        if n > 0:
            self._preemptions.inc(n)

    def record_prefix_cache(self, queries: int, hits: int) -> None:
        """Token counts of one prefix-cache lookup (hits <= queries)."""
        if queries > 0:
            self._prefix_queries.inc(queries)
        if hits > 0:
            self._prefix_hits.inc(hits)

    def record_tokens(self, prompt: int, generation: int) -> None:
        if prompt > 0:
            self._prompt_tokens.inc(prompt)
        if generation > 0:
            self._generation_tokens.inc(generation)
