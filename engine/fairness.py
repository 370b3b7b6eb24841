"""Fair share across tenants: the Virtual Token Counter (VTC, Sheng et al., OSDI '24).

Each tenant has a counter of the service it received: every token computed
for it (prefill or decode) adds 1/weight. The scheduler serves the backlogged
tenant with the smallest counter first and preempts from the largest, so
over time each backlogged tenant receives tokens in proportion to its weight,
however many requests it sends.

A tenant that was idle would otherwise return with a small counter and
monopolize the engine until it "caught up". So when a tenant becomes active
its counter is lifted to the smallest counter of the tenants active now (or,
when none is, to the counter of the last tenant that went idle): idle time
earns no credit.
"""

from __future__ import annotations

import math

from hydrant.engine.errors import InvalidRequestError


class VirtualTokenCounter:
    """Per-tenant service counters, with the lift on (re)activation."""

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._active: dict[str, int] = {}  # tenant -> unfinished requests
        self._last_departed = 0.0

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def is_active(self, tenant: str) -> bool:
        return tenant in self._active

    def arrive(self, tenant: str) -> None:
        """A request of `tenant` entered the engine."""
        if tenant not in self._active:
            others = [self._counters.get(t, 0.0) for t in self._active]
            floor = min(others) if others else self._last_departed
            self._counters[tenant] = max(self._counters.get(tenant, 0.0), floor)
            self._active[tenant] = 0
        self._active[tenant] += 1

    def depart(self, tenant: str) -> None:
        """A request of `tenant` finished or was aborted."""
        remaining = self._active.get(tenant, 0) - 1
        if remaining > 0:
            self._active[tenant] = remaining
            return
        self._active.pop(tenant, None)
        self._last_departed = self._counters.get(tenant, 0.0)

    def charge(self, tenant: str, tokens: int, weight: float) -> None:
        """Count `tokens` of service for `tenant`, scaled by 1/weight."""
        self._counters[tenant] = self._counters.get(tenant, 0.0) + tokens / weight


def check_weight(weight: float) -> None:
    """A tenant weight must be a positive finite number (it divides the counter)."""
    if not isinstance(weight, int | float) or not math.isfinite(weight) or weight <= 0:
        raise InvalidRequestError(f"tenant_weight must be a positive number, got {weight!r}")
