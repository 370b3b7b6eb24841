"""The gateway's Prometheus metrics, the `/metrics` route, and the ledger hook that feeds them."""

from hydrant.platform.metrics.gateway import GatewayMetrics
from hydrant.platform.metrics.metered_ledger import MeteredLedger
from hydrant.platform.metrics.route import (
    METRICS_CONTENT_TYPE,
    bearer_token_guard,
    metrics_route,
    render_registries,
)

__all__ = [
    "METRICS_CONTENT_TYPE",
    "GatewayMetrics",
    "MeteredLedger",
    "bearer_token_guard",
    "metrics_route",
    "render_registries",
]
