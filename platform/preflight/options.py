"""What a preflight run is held to: every threshold, with the reason for its default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PreflightOptions:
    model: str | None = None
    metrics_token: str | None = None  # sent to /metrics when the deployment requires one
    log_file: Path | None = None
    infra_dir: Path | None = None  # PrometheusRule and Grafana files; `./infra` when it exists
    only: frozenset[str] | None = None  # run only these checks (by name)
    # Dynamic batching: a burst of tiny requests must be computed together, i.e. the
    # mean tokens per engine step must rise this many times above a lone request's.
    batch_requests: int = 100
    batch_factor: float = 4.0
    # Long-tail isolation: short requests' p99 with 10% long prompts in flight may be at
    # most `tail_factor` x their solo p99, or solo p99 + `tail_slack_s` (small p99s jitter).
    short_prompt_tokens: int = 128
    long_prompt_tokens: int = 1024
    tail_factor: float = 3.0
    tail_slack_s: float = 0.5
    # RSS after a round of traffic and idle, against before it.
    rss_growth: float = 0.10
    idle_timeout_s: float = 60.0
    # The KV usage alert the launch checklist asks for: P1 at 95%.
    kv_alert_threshold: float = 0.95
    cold_start_sla_s: float = 120.0
    rollback_to: Path | None = None  # the previous checkpoint (as the workers see the path)
    swap_timeout_s: float = 600.0  # one swap's HTTP call; the pool's own timeout is 300 s
    rollback_requests: int = 20
