"""`MeteredLedger`: a `LedgerWriter` that feeds the gateway metrics from every entry it records.

It wraps the real writer, so the metrics count exactly the requests the
ledger counts: one per request, after the entry is durable (in the database
or in the spool). From the request itself it measures the outcome, the
tokens, the device seconds and the gateway's overhead (the request's time
from its context being made to its outcome, minus the engine's own
end-to-end time).

Money: given the price book the request path already holds (`PriceBook`, the
prices in force now, by model) and the device price, it prices the request
with the ledger's own functions (`charge_for`, `device_cost`). The ledger
prices at the version in force when the request started, so around a price
change the counter may differ from the ledger for the book's refresh
interval; the counter is for dashboards, the ledger is what is billed.
A failure of the metrics never fails the request: the entry is already written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from decimal import Decimal

from hydrant.platform.billing.device import DevicePrice, device_cost, seconds_from_ns
from hydrant.platform.billing.pricing import (
    Price,
    TokenUsage,
    adapter_model_name,
    charge_for,
    price_of,
)
from hydrant.platform.ledger.accounting import LedgerWriter, Metered, Outcome
from hydrant.platform.metrics.gateway import GatewayMetrics

log = logging.getLogger(__name__)

PriceLookup = Callable[[str], Price | None]


def overhead_seconds(ctx: Metered, outcome: Outcome) -> float | None:
    """Gateway time outside the engine, or None when the engine did not report its time."""
    engine = outcome.usage.e2e_seconds
    if engine is None:
        return None
    total = (outcome.finished_at - ctx.started_at).total_seconds()
    return max(0.0, total - engine)


class MeteredLedger:
    """`LedgerWriter` decorator: `inner.record`, then the metrics of that entry."""

    def __init__(
        self,
        inner: LedgerWriter,
        metrics: GatewayMetrics,
        *,
        prices: PriceLookup | None = None,
        device_price: DevicePrice | None = None,
    ) -> None:
        self.inner = inner
        self.metrics = metrics
        self.prices = prices
        self.device_price = device_price

    async def record(self, ctx: Metered, outcome: Outcome) -> None:
        await self.inner.record(ctx, outcome)
        self.observe(ctx, outcome)

    def observe(self, ctx: Metered, outcome: Outcome, *, price: Price | None = None) -> None:
        """The metrics of one recorded entry (`price`: what it was charged at, when not the
        model's interactive price: a Batch API line's, recorded by the batch runner)."""
        try:
            self._observe(ctx, outcome, price)
        except Exception as exc:  # a metrics bug must not turn a served request into an error
            log.warning("could not update gateway metrics: %s", type(exc).__name__)

    def _observe(self, ctx: Metered, outcome: Outcome, charged_at: Price | None) -> None:
        usage = outcome.usage
        seconds = seconds_from_ns(usage.device_ns)
        # An adapter's requests under `base:adapter`: bounded, only registered adapters resolve.
        model = adapter_model_name(ctx.model, ctx.adapter)
        self.metrics.observe_request(
            ctx.tenant_id,
            model,
            outcome.status,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            device_seconds=float(seconds),
        )
        overhead = overhead_seconds(ctx, outcome)
        if overhead is not None:
            self.metrics.observe_overhead(model, overhead)
        price = charged_at
        if price is None and self.prices is not None:
            price = price_of(self.prices, ctx.model, ctx.adapter)
        if price is None and self.device_price is None:
            return
        tokens = TokenUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            cached_input_tokens=usage.cached_tokens,
        )
        self.metrics.observe_charge(
            ctx.tenant_id,
            model,
            charge_for(tokens, price) if price is not None else Decimal(0),
            device_cost(seconds, self.device_price)
            if self.device_price is not None
            else Decimal(0),
        )
