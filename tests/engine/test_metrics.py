"""EngineMetrics: every metric is exported under its vLLM-style name, per model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from hydrant.engine.metrics import EngineMetrics

EXPECTED_NAMES = [
    "hydrant_num_requests_running",
    "hydrant_num_requests_waiting",
    "hydrant_kv_cache_usage_perc",
    "hydrant_prefix_cache_queries_total",
    "hydrant_prefix_cache_hits_total",
    "hydrant_num_preemptions_total",
    "hydrant_prompt_tokens_total",
    "hydrant_generation_tokens_total",
    "hydrant_time_to_first_token_seconds_bucket",
    "hydrant_inter_token_latency_seconds_bucket",
    "hydrant_request_queue_time_seconds_bucket",
    "hydrant_e2e_request_latency_seconds_bucket",
    "hydrant_batch_tokens_per_step_bucket",
]


@dataclass
class Finished:
    arrival_time: float = 100.0
    first_scheduled_time: float | None = 100.5
    first_token_time: float | None = 101.0
    finish_time: float | None = 103.0
    completion_tokens: int = 5


def _value(registry: CollectorRegistry, name: str, model: str = "demo") -> float | None:
    return registry.get_sample_value(name, {"model": model})


def test_every_metric_is_exported_after_observations() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry, model="demo")
    metrics.observe_step(num_running=3, num_waiting=2, kv_usage=0.25, num_batched_tokens=512)
    metrics.observe_finished(Finished())
    metrics.record_preemption(2)
    metrics.record_prefix_cache(queries=64, hits=48)
    metrics.record_tokens(prompt=64, generation=5)
    text = generate_latest(registry).decode()
    for name in EXPECTED_NAMES:
        assert f"{name}{{" in text, name
    assert _value(registry, "hydrant_num_requests_running") == 3
    assert _value(registry, "hydrant_num_requests_waiting") == 2
    assert _value(registry, "hydrant_kv_cache_usage_perc") == 0.25
    assert _value(registry, "hydrant_prefix_cache_hits_total") == 48
    assert _value(registry, "hydrant_prefix_cache_queries_total") == 64
    assert _value(registry, "hydrant_num_preemptions_total") == 2
    assert _value(registry, "hydrant_prompt_tokens_total") == 64
    assert _value(registry, "hydrant_generation_tokens_total") == 5
    assert _value(registry, "hydrant_time_to_first_token_seconds_sum") == pytest.approx(1.0)
    assert _value(registry, "hydrant_request_queue_time_seconds_sum") == pytest.approx(0.5)
    assert _value(registry, "hydrant_e2e_request_latency_seconds_sum") == pytest.approx(3.0)
    # (103 - 101) / (5 - 1): the mean gap between output tokens
    assert _value(registry, "hydrant_inter_token_latency_seconds_sum") == pytest.approx(0.5)
    assert _value(registry, "hydrant_batch_tokens_per_step_sum") == 512


def test_two_models_share_one_registry() -> None:
    registry = CollectorRegistry()
    first = EngineMetrics(registry, model="a")
    second = EngineMetrics(registry, model="b")
    first.record_tokens(prompt=10, generation=0)
    second.record_tokens(prompt=0, generation=7)
    assert _value(registry, "hydrant_prompt_tokens_total", "a") == 10
    assert _value(registry, "hydrant_generation_tokens_total", "b") == 7
    assert _value(registry, "hydrant_generation_tokens_total", "a") == 0


def test_aborted_request_skips_times_that_never_happened() -> None:
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry, model="demo")
    metrics.observe_finished(
        Finished(first_scheduled_time=None, first_token_time=None, completion_tokens=0)
    )
    assert _value(registry, "hydrant_e2e_request_latency_seconds_count") == 1
    assert _value(registry, "hydrant_time_to_first_token_seconds_count") == 0
    assert _value(registry, "hydrant_inter_token_latency_seconds_count") == 0
    metrics.observe_step(0, 0, kv_usage=1.7, num_batched_tokens=0)
    assert _value(registry, "hydrant_kv_cache_usage_perc") == 1.0
    assert _value(registry, "hydrant_batch_tokens_per_step_count") == 0


def test_a_request_that_generated_nothing_has_no_first_token() -> None:
    """An embedding (or a scored prompt) is timed end to end, not as a first token."""
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry, model="demo")
    metrics.observe_finished(Finished(first_token_time=105.0, completion_tokens=0))
    assert _value(registry, "hydrant_time_to_first_token_seconds_count") == 0
    assert _value(registry, "hydrant_e2e_request_latency_seconds_count") == 1
