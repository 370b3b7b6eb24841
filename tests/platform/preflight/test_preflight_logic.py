"""The pure parts of preflight: rule parsing, metric names, capacity arithmetic, the table."""

from __future__ import annotations

from pathlib import Path

from hydrant.platform.engines.service import summarize_lengths
from hydrant.platform.preflight.capacity import judge_capacity, sequences_that_fit
from hydrant.platform.preflight.metrics_text import Scrape, histogram_mean, names_in
from hydrant.platform.preflight.observability import (
    alert_threshold,
    find_canaries,
    kv_alert_rules,
    referenced_metrics,
)
from hydrant.platform.preflight.report import CheckResult, Status, as_json, format_table

RULE = """\
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
spec:
  groups:
    - name: g
      rules:
        - alert: KVHigh
          expr: avg(hydrant_kv_cache_usage_perc{{model="demo"}}) >= {value}
          labels: {{severity: {severity}}}
"""


def test_kv_alert_rule_threshold_and_severity(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.format(value="0.9", severity="P2"))
    (rule,) = kv_alert_rules([path])
    assert rule["alert"] == "KVHigh"
    assert alert_threshold(rule) == 0.9
    path.write_text(RULE.format(value=".95", severity="critical"))
    (rule,) = kv_alert_rules([path])
    assert alert_threshold(rule) == 0.95


def test_metric_names_are_read_in_base_form(tmp_path: Path) -> None:
    dashboard = tmp_path / "dash.json"
    dashboard.write_text(
        '{"panels":[{"targets":[{"expr":"rate(hydrant_gateway_requests_total[5m])"},'
        '{"expr":"histogram_quantile(0.99, hydrant_e2e_request_latency_seconds_bucket)"}]}]}'
    )
    used = referenced_metrics([dashboard])
    assert set(used) == {"hydrant_gateway_requests", "hydrant_e2e_request_latency_seconds"}
    assert names_in("process_resident_memory_bytes / 2") == {"process_resident_memory_bytes"}


def test_histogram_mean_between_scrapes() -> None:
    text = (
        "# TYPE hydrant_batch_tokens_per_step histogram\n"
        'hydrant_batch_tokens_per_step_bucket{{model="m",le="+Inf"}} {n}\n'
        'hydrant_batch_tokens_per_step_count{{model="m"}} {n}\n'
        'hydrant_batch_tokens_per_step_sum{{model="m"}} {s}\n'
    )
    before = Scrape.parse(text.format(n=4, s=8))
    after = Scrape.parse(text.format(n=6, s=108))
    assert histogram_mean(before, after, "hydrant_batch_tokens_per_step", model="m") == (50.0, 2)
    assert after.has("hydrant_batch_tokens_per_step_bucket")
    assert not after.has("hydrant_kv_cache_usage_perc")


def test_capacity_arithmetic_matches_the_field_trap() -> None:
    # 1024 blocks of 16 tokens, sequences of 2048 tokens (128 blocks): 8 fit, not 256.
    assert sequences_that_fit(1024, 16, 2048) == 8
    assert sequences_that_fit(1024, 16, 2049) == 7
    engine = {
        "max_num_seqs": 256,
        "num_total_blocks": 1024,
        "block_size": 16,
        "max_model_len": 2048,
        "observed": None,
    }
    result = judge_capacity(engine)
    assert result.status is Status.FAIL and "8 fit" in result.measured
    observed = summarize_lengths([(100, 28)] * 99 + [(1000, 24)])
    assert observed is not None and observed.prompt_p99 == 100  # nearest rank of 100 samples
    engine["observed"] = {
        "samples": observed.samples,
        "prompt_p99": observed.prompt_p99,
        "output_p99": observed.output_p99,
    }
    engine["max_num_seqs"] = 128
    assert judge_capacity(engine).status is Status.PASS  # 128 tokens = 8 blocks: 128 fit


def test_canaries_are_found_and_the_table_shows_measurements() -> None:
    assert find_canaries("a hyd_live_abc line", {"key": "hyd_live_abc", "p": "zzz"}) == ["key"]
    results = [
        CheckResult.judge("a", True, "<= 1", "0.5"),
        CheckResult.judge("b", False, "<= 1", "2", "too big"),
        CheckResult.skip("c", "-", "not applicable: no worker pools"),
    ]
    table = format_table(results)
    assert "1 passed, 1 failed, 1 skipped" in table
    assert "FAIL b: too big" in table
    assert as_json("u", results)["ok"] is False


def test_pool_readiness_counts_only_serving_workers() -> None:
    from hydrant.platform.preflight.pools import _ready_workers

    pool = {
        "workers": [
            {"state": "ready", "retired": False},
            {"state": "ready", "retired": True},  # being drained
            {"state": "starting", "retired": False},
        ]
    }
    assert _ready_workers(pool) == 1
    assert _ready_workers({"workers": []}) == 0


async def test_an_upstream_pool_has_cold_starts_and_no_rollback_drill() -> None:
    """An upstream pool (vLLM) rolls out with its own deployment: the drill SKIPs with the
    reason, before any request. Asleep or at zero (no member ready), its first request is
    a cold start, measured as a worker pool's."""
    from hydrant.platform.preflight.options import PreflightOptions
    from hydrant.platform.preflight.pools import check_cold_start, check_rollback
    from hydrant.platform.preflight.session import PreflightSession

    session = PreflightSession(url="http://127.0.0.1:9", admin_key="unused", model="big")
    pool = {"model": "big", "kind": "openai", "path": "/w", "workers": []}  # none ready
    try:
        cold = await check_cold_start(session, PreflightOptions(), pool, True, 0.1)
        drill = PreflightOptions(rollback_to=Path("/previous"))
        rollback = await check_rollback(session, drill, pool, True)
    finally:
        await session.close()
    assert rollback.status is Status.SKIP and "upstream pool (openai)" in rollback.detail
    assert cold.status is Status.PASS and cold.measured == "0.1 s"
