"""Gateway metrics label an adapter's requests `base:adapter` and price them at its price."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from hydrant.engine.protocol import RequestUsage, Sampling
from hydrant.platform.billing.pricing import Price
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.metrics import GatewayMetrics
from hydrant.platform.metrics.metered_ledger import MeteredLedger
from hydrant.platform.quotas.admission import RequestContext

START = datetime(2026, 12, 5, tzinfo=UTC)
OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(prompt_tokens=1000, cached_tokens=0, completion_tokens=0, device_ns=0),
    finished_at=START,
)
PRICES = {
    "demo": Price(input_per_million=Decimal(1), output_per_million=Decimal(1)),
    "demo:sql": Price(input_per_million=Decimal(5), output_per_million=Decimal(5)),
}


class NoLedger:
    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        return None


def _ctx(adapter: str | None) -> RequestContext:
    return RequestContext(
        request_id="r",
        tenant_id="ten_a",
        api_key_id=None,
        key_prefix="p",
        model="demo",
        prepared=PreparedRequest.single([1], Sampling()),
        started_at=START,
        adapter=adapter,
    )


async def test_adapter_requests_are_labelled_and_priced_as_the_adapter() -> None:
    metrics = GatewayMetrics()
    metered = MeteredLedger(NoLedger(), metrics, prices=PRICES.get)
    for adapter in ("sql", "chat", None):
        await metered.record(_ctx(adapter), OUTCOME)

    def value(name: str, model: str) -> float | None:
        labels = {"tenant": "ten_a", "model": model}
        return metrics.registry.get_sample_value(name, labels)

    charged = "hydrant_gateway_charged_micro_units_total"
    assert value(charged, "demo:sql") == 5000  # its own price: 1000 tokens at 5 per million
    assert value(charged, "demo:chat") == 1000  # none of its own: the base model's
    assert value(charged, "demo") == 1000
    assert value("hydrant_gateway_prompt_tokens_total", "demo:sql") == 1000
