"""`GET /metrics`: the gateway's registry and the engines' registries of the same process.

The families of every registry are merged by name before rendering: each
in-process engine has its own registry with the same metric names (told apart
by their `model` label), and Prometheus rejects a second `# HELP`/`# TYPE` for
one name, so the registries cannot simply be concatenated. The format is the
text exposition format 0.0.4, which every Prometheus server reads.
It carries tenant ids and volumes. With `HYDRANT_METRICS_TOKEN` set, a scrape
must send `Authorization: Bearer <token>` (what Prometheus's `authorization`
scrape setting sends); without it the route is open, like most exporters, and
belongs on the internal network only.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Sequence
from typing import Any

from litestar import Response, get
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler, HTTPRouteHandler
from litestar.types import Guard
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

from hydrant.errors import ConfigurationError
from hydrant.platform.errors import AuthenticationFailed

# A scrape token shorter than this is refused at start: it could be guessed.
MIN_TOKEN_CHARS = 16

# Litestar appends the charset to `text/*` media types itself.
_MEDIA_TYPE = "text/plain; version=0.0.4"
METRICS_CONTENT_TYPE = f"{_MEDIA_TYPE}; charset=utf-8"


class MergedCollector:
    """One collector over several registries: same-named families share one header."""

    def __init__(self, registries: Sequence[CollectorRegistry]) -> None:
        self._registries = tuple(registries)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                known = merged.get(family.name)
                if known is None:
                    copy = Metric(family.name, family.documentation, family.type, family.unit)
                    copy.samples = list(family.samples)
                    merged[family.name] = copy
                elif known.type == family.type:
                    known.samples.extend(family.samples)
                else:
                    raise ValueError(
                        f"metric {family.name!r} is a {known.type} in one registry"
                        f" and a {family.type} in another"
                    )
        yield from merged.values()


def render_registries(registries: Sequence[CollectorRegistry]) -> bytes:
    combined = CollectorRegistry(auto_describe=False)
    combined.register(MergedCollector(registries))
    return generate_latest(combined)


def metrics_route(
    registries: Sequence[CollectorRegistry], *, guards: Sequence[Guard] = ()
) -> HTTPRouteHandler:
    """A `/metrics` handler over `registries` (read at each scrape, so they may keep filling)."""
    chosen = registries  # read at each scrape: a list passed in may still grow

    # In a thread: a registry may scrape another process (the embedded default's engine
    # children, hydrant.platform.dispatch.embedded), which must not block the event loop.
    @get(
        "/metrics",
        guards=list(guards),
        include_in_schema=False,
        sync_to_thread=True,
        media_type=_MEDIA_TYPE,
    )
    def metrics() -> Response[bytes]:
        return Response(render_registries(chosen), media_type=_MEDIA_TYPE)

    return metrics


def bearer_token_guard(token: str) -> Guard:
    """A guard admitting requests that carry `Authorization: Bearer <token>`.

    The comparison is constant-time, so response timing does not reveal how much
    of a guess matched.
    """
    if len(token) < MIN_TOKEN_CHARS:
        raise ConfigurationError(
            f"HYDRANT_METRICS_TOKEN must be at least {MIN_TOKEN_CHARS} characters; make one with"
            ' python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    expected = token.encode()

    async def require_token(
        connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
    ) -> None:
        scheme, _sep, given = connection.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise AuthenticationFailed(
                "this /metrics needs the scrape token:"
                " Authorization: Bearer <HYDRANT_METRICS_TOKEN>",
                code="invalid_metrics_token",
            )

    return require_token
