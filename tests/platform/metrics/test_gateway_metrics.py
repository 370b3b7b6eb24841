"""Gateway metrics: every family appears once observed, money stays exact, `/metrics` serves it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from hydrant.engine.protocol import RequestUsage, Sampling
from hydrant.errors import ConfigurationError
from hydrant.platform.app import create_app
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.billing.pricing import Price
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.metrics import (
    METRICS_CONTENT_TYPE,
    GatewayMetrics,
    MeteredLedger,
    metrics_route,
    render_registries,
)
from hydrant.platform.quotas.admission import RequestContext
from hydrant.platform.services import build_services
from hydrant.settings import load_settings

START = datetime(2026, 3, 1, 12, tzinfo=UTC)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    sample = registry.get_sample_value(name, labels)
    assert sample is not None, f"{name}{labels} is not exported"
    return sample


def context(tenant: str = "ten_a", model: str = "alpha") -> RequestContext:
    prepared = PreparedRequest.single([1, 2, 3], Sampling())
    return RequestContext(
        request_id="req_1",
        tenant_id=tenant,
        api_key_id="key_1",
        key_prefix="abc",
        model=model,
        prepared=prepared,
        started_at=START,
    )


def outcome(seconds: float = 2.0, engine_s: float | None = 1.75) -> Outcome:
    usage = RequestUsage(
        prompt_tokens=1000,
        cached_tokens=400,
        completion_tokens=250,
        device_ns=1_500_000_000,
        e2e_seconds=engine_s,
    )
    return Outcome(status="finished", usage=usage, finished_at=START + timedelta(seconds=seconds))


class RecordingLedger:
    def __init__(self, fail: bool = False) -> None:
        self.recorded: list[str] = []
        self.fail = fail

    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        if self.fail:
            raise ConnectionError("spool full and database down")
        self.recorded.append(ctx.request_id)


def test_every_metric_appears_after_observations() -> None:
    metrics = GatewayMetrics()
    metrics.observe_request("ten_a", "alpha", "finished", prompt_tokens=10, completion_tokens=5)
    metrics.observe_charge("ten_a", "alpha", Decimal("0.000001"), Decimal("0.5"))
    metrics.observe_quota_refusal("ten_a", "rate_limit")
    metrics.observe_long_lane_queue("alpha", 3.5)
    metrics.observe_overhead("alpha", 0.004)
    metrics.observe_quota_admission(0.0003)
    metrics.set_spool_depth(7)
    text = render_registries([metrics.registry]).decode()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert names >= {
        "hydrant_gateway_requests",
        "hydrant_gateway_prompt_tokens",
        "hydrant_gateway_cached_prompt_tokens",
        "hydrant_gateway_completion_tokens",
        "hydrant_gateway_device_seconds",
        "hydrant_gateway_charged_micro_units",
        "hydrant_gateway_device_cost_micro_units",
        "hydrant_quota_refusals",
        "hydrant_long_lane_queue_seconds",
        "hydrant_gateway_overhead_seconds",
        "hydrant_quota_admission_seconds",
        "hydrant_ledger_spool_entries",
    }
    r = metrics.registry
    labels = {"tenant": "ten_a", "model": "alpha"}
    assert value(r, "hydrant_gateway_requests_total", status="finished", **labels) == 1
    assert value(r, "hydrant_gateway_charged_micro_units_total", **labels) == 1
    assert value(r, "hydrant_gateway_device_cost_micro_units_total", **labels) == 500_000
    assert value(r, "hydrant_quota_refusals_total", tenant="ten_a", reason="rate_limit") == 1
    assert value(r, "hydrant_long_lane_queue_seconds_count", model="alpha") == 1
    assert value(r, "hydrant_long_lane_queue_seconds_sum", model="alpha") == 3.5
    assert value(r, "hydrant_quota_admission_seconds_count") == 1
    assert value(r, "hydrant_quota_admission_seconds_bucket", le="0.0005") == 1
    assert value(r, "hydrant_quota_admission_seconds_bucket", le="0.00025") == 0
    assert value(r, "hydrant_ledger_spool_entries") == 7


def test_money_is_counted_in_exact_micro_units_and_floats_are_refused() -> None:
    metrics = GatewayMetrics()
    for _ in range(10):
        metrics.observe_charge("t", "m", Decimal("0.1"))
    # Ten float additions of 0.1 give 0.9999999999999999; ten micro-unit counts give 1e6.
    assert (
        value(metrics.registry, "hydrant_gateway_charged_micro_units_total", tenant="t", model="m")
        == 1_000_000
    )
    with pytest.raises(TypeError):
        metrics.observe_charge("t", "m", 0.1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        metrics.observe_charge("t", "m", Decimal("-1"))
    with pytest.raises(ValueError, match="prompt_tokens"):
        metrics.observe_request("t", "m", "finished", prompt_tokens=-1)


async def test_metered_ledger_records_then_counts_the_entry() -> None:
    metrics = GatewayMetrics()
    inner = RecordingLedger()
    price = Price(
        input_per_million=Decimal("2"),
        output_per_million=Decimal("8"),
        cached_input_per_million=Decimal("0.5"),
    )
    ledger = MeteredLedger(
        inner, metrics, prices={"alpha": price}.get, device_price=DevicePrice(Decimal("3.6"))
    )
    await ledger.record(context(), outcome())
    assert inner.recorded == ["req_1"]
    r = metrics.registry
    labels = {"tenant": "ten_a", "model": "alpha"}
    assert value(r, "hydrant_gateway_requests_total", status="finished", **labels) == 1
    assert value(r, "hydrant_gateway_prompt_tokens_total", **labels) == 1000
    assert value(r, "hydrant_gateway_cached_prompt_tokens_total", **labels) == 400
    assert value(r, "hydrant_gateway_completion_tokens_total", **labels) == 250
    assert value(r, "hydrant_gateway_device_seconds_total", **labels) == 1.5
    # 600 x 2 + 400 x 0.5 + 250 x 8 = 3400 per million tokens = 0.0034 = 3400 micro-units.
    assert value(r, "hydrant_gateway_charged_micro_units_total", **labels) == 3400
    # 1.5 s at 3.6 an hour = 0.0015 = 1500 micro-units.
    assert value(r, "hydrant_gateway_device_cost_micro_units_total", **labels) == 1500
    # 2.0 s in the gateway, 1.75 s in the engine.
    assert value(r, "hydrant_gateway_overhead_seconds_sum", model="alpha") == pytest.approx(0.25)


async def test_metered_ledger_without_prices_or_engine_time_counts_what_it_knows() -> None:
    metrics = GatewayMetrics()
    await MeteredLedger(RecordingLedger(), metrics).record(context(), outcome(engine_s=None))
    r = metrics.registry
    assert value(r, "hydrant_gateway_prompt_tokens_total", tenant="ten_a", model="alpha") == 1000
    assert (
        r.get_sample_value(
            "hydrant_gateway_charged_micro_units_total", {"tenant": "ten_a", "model": "alpha"}
        )
        is None
    )
    assert r.get_sample_value("hydrant_gateway_overhead_seconds_count", {"model": "alpha"}) is None


async def test_an_entry_that_was_not_written_is_not_counted() -> None:
    metrics = GatewayMetrics()
    with pytest.raises(ConnectionError):
        await MeteredLedger(RecordingLedger(fail=True), metrics).record(context(), outcome())
    assert (
        metrics.registry.get_sample_value(
            "hydrant_gateway_requests_total",
            {"tenant": "ten_a", "model": "alpha", "status": "finished"},
        )
        is None
    )


def test_spool_depth_is_read_at_scrape_time(data_dir: Path) -> None:
    metrics = GatewayMetrics()
    with LedgerSpool(data_dir / "ledger.spool") as spool:
        metrics.watch_spool(spool)
        assert value(metrics.registry, "hydrant_ledger_spool_entries") == 0
        spool.append({"request_id": "a"})
        spool.append({"request_id": "b"})
        assert value(metrics.registry, "hydrant_ledger_spool_entries") == 2


def test_registries_with_the_same_names_merge_under_one_header() -> None:
    engines = []
    for model in ("alpha", "beta"):
        registry = CollectorRegistry()
        Gauge("hydrant_num_requests_running", "Running.", ["model"], registry=registry).labels(
            model
        ).set(3)
        engines.append(registry)
    text = render_registries([GatewayMetrics().registry, *engines]).decode()
    assert text.count("# TYPE hydrant_num_requests_running gauge") == 1
    family = next(
        f for f in text_string_to_metric_families(text) if f.name == "hydrant_num_requests_running"
    )
    assert sorted(s.labels["model"] for s in family.samples) == ["alpha", "beta"]
    clash = CollectorRegistry()
    Counter("hydrant_num_requests_running", "Not a gauge.", registry=clash)
    with pytest.raises(ValueError, match="hydrant_num_requests_running"):
        render_registries([engines[0], clash])


async def test_metrics_route_serves_the_registries_it_was_given() -> None:
    metrics = GatewayMetrics()
    registries = [metrics.registry]
    app = Litestar(route_handlers=[metrics_route(registries)])
    engine = CollectorRegistry()
    Gauge("hydrant_kv_cache_usage_perc", "KV usage.", registry=engine).set(0.25)
    registries.append(engine)  # an engine registered after the app was built
    metrics.observe_quota_refusal("ten_a", "budget_exhausted")
    async with AsyncTestClient(app) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == METRICS_CONTENT_TYPE
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert (
        'hydrant_quota_refusals_total{reason="budget_exhausted",tenant="ten_a"} 1.0'
        in response.text
    )
    assert "hydrant_kv_cache_usage_perc 0.25" in response.text


async def test_the_gateway_app_serves_metrics(data_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir)
    services = build_services(settings, models=())
    services.metrics.set_spool_depth(3)
    app = create_app(settings, services)
    async with AsyncTestClient(app) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "hydrant_ledger_spool_entries 3.0" in response.text


async def test_with_a_metrics_token_a_scrape_must_carry_it(data_dir: Path) -> None:
    token = "scrape-" + "x" * 24
    app = create_app(load_settings({"HYDRANT_METRICS_TOKEN": token}, data_dir=data_dir))
    async with AsyncTestClient(app) as client:
        anonymous = await client.get("/metrics")
        wrong = await client.get("/metrics", headers={"Authorization": f"Bearer {token}y"})
        basic = await client.get("/metrics", headers={"Authorization": f"Basic {token}"})
        right = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
        health = await client.get("/healthz")  # probes stay open
    for refused in (anonymous, wrong, basic):
        assert refused.status_code == 401
        assert refused.json()["error"]["code"] == "invalid_metrics_token"
        assert "hydrant_" not in refused.text
    assert right.status_code == 200
    assert "hydrant_ledger_spool_entries" in right.text
    assert health.status_code == 200


def test_a_short_metrics_token_is_refused_at_start(data_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        create_app(load_settings({}, data_dir=data_dir, metrics_token="short"))
