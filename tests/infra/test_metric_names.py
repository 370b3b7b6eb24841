"""Every metric that infra/ queries (alert rules, KEDA triggers, the Grafana dashboard) is
one the code really exports, under the exact exposed name (`_total`, `_bucket`, ...).

The exported names are read from the real registries: the engine's `EngineMetrics`,
the gateway's `GatewayMetrics` and the pools' `PoolMetrics`."""

from __future__ import annotations

import json
import re
from pathlib import Path

from infra_render import Obj, render
from prometheus_client import CollectorRegistry

from hydrant.engine.metrics import EngineMetrics
from hydrant.platform.dispatch.metrics import PoolMetrics, PoolSnapshot
from hydrant.platform.metrics.gateway import GatewayMetrics

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bhydrant_[a-z0-9_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "info": ("_info",),
}


def exposed_names() -> set[str]:
    """Every sample name the three registries can expose."""
    names: set[str] = set()
    engine = CollectorRegistry()
    EngineMetrics(engine, model="m")
    gateway = GatewayMetrics(CollectorRegistry()).registry
    pools = PoolMetrics(CollectorRegistry())
    pools.watch(lambda: [PoolSnapshot("m", {"ready": 1})])
    for registry in (engine, gateway, pools.registry):
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES[family.type])
            names.update(sample.name for sample in family.samples)
    return names


def queried_names() -> dict[str, set[str]]:
    """Metric name -> where infra/ uses it."""
    used: dict[str, set[str]] = {}

    def add(text: str, where: str) -> None:
        for name in NAME.findall(text):
            used.setdefault(name, set()).add(where)

    overlays = sorted((ROOT / "infra" / "k8s" / "overlays").iterdir())
    objects: list[Obj] = [obj for overlay in overlays for obj in render(overlay)]
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "PrometheusRule":
            for group in obj["spec"]["groups"]:
                for rule in group["rules"]:
                    add(rule["expr"], where)
        elif obj["kind"] == "ScaledObject":
            for trigger in obj["spec"]["triggers"]:
                add(trigger["metadata"].get("query", ""), where)
        elif obj["kind"] == "ConfigMap" and "hydrant-overview.json" in obj.get("data", {}):
            dashboard = json.loads(obj["data"]["hydrant-overview.json"])
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    add(target["expr"], where)
    return used


def test_every_queried_metric_is_exported() -> None:
    exported = exposed_names()
    used = queried_names()
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"infra/ queries metrics nobody exports: {missing}"


def test_the_check_covers_all_three_sources_and_catches_a_wrong_name() -> None:
    exported = exposed_names()
    used = queried_names()
    # each source is really queried somewhere (alerts, autoscaling, dashboard)
    for name in (
        "hydrant_kv_cache_usage_perc",  # engine
        "hydrant_quota_refusals_total",  # gateway
        "hydrant_ledger_spool_entries",  # gateway
        "hydrant_pool_waiting_requests",  # pools
        "hydrant_pool_wake_seconds_bucket",  # pools, histogram
        "hydrant_dispatch_retries_total",  # pools, counter
        "hydrant_time_to_first_token_seconds_bucket",  # engine, histogram
    ):
        assert name in used, name
        assert name in exported, name
    # a counter queried without `_total` is a name Prometheus never has
    assert "hydrant_gateway_requests" not in exported
    assert "hydrant_gateway_requests_total" in exported
    assert "hydrant_pool_wake_seconds" not in exported
