"""Slow down key guessing: a source with too many failed key attempts is refused for a while.

Why per source and before authenticating: while a source is blocked, every
request it sends gets the same 429, with a right key or a wrong one, so the
block itself never tells a guesser that a key exists. Why on the quota
store: failures and blocks are sliding windows, exactly what `WindowCheck`
counts, and on Redis the count is shared by every gateway (a guesser cannot
spread attempts over nodes). Why fail open on a store outage: the key check
itself does not need the store, and the quota gate already applies the
configured failure mode to the requests that get through.

A recent "not blocked" answer is kept in-process for `CLEAR_CACHE_S`, so a
busy source costs the store one lookup a second, not one per request; a
block set by another gateway applies here within that time.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from hydrant.errors import ConfigurationError
from hydrant.platform.errors import RateLimited
from hydrant.platform.quotas import (
    InMemoryQuotaBackend,
    QuotaBackend,
    QuotaExceeded,
    WindowCheck,
)
from hydrant.platform.quotas.guard import OutageLog
from hydrant.settings import Settings

log = logging.getLogger(__name__)

CLEAR_CACHE_S = 1.0
CLEAR_CACHE_MAX = 10_000
BLOCKED_MESSAGE = "too many failed authentication attempts from this address; retry later"


@dataclass(frozen=True)
class BruteForcePolicy:
    max_failures: int = 20
    window_s: float = 60.0
    block_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_failures < 1:
            raise ConfigurationError("HYDRANT_AUTH_MAX_FAILURES must be at least 1")
        if not (self.window_s > 0 and self.block_s > 0):
            raise ConfigurationError(
                "HYDRANT_AUTH_FAILURE_WINDOW_S and HYDRANT_AUTH_BLOCK_S must be positive"
            )


class BruteForceMetrics:
    """Counters only, no per-address labels (an attacker controls how many there are)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.failures = Counter(
            "hydrant_auth_failures",
            "Requests refused for an invalid API key (counted per source by the guard).",
            registry=self.registry,
        )
        self.blocks = Counter(
            "hydrant_auth_sources_blocked",
            "Sources blocked for too many failed key attempts.",
            registry=self.registry,
        )
        self.refused = Counter(
            "hydrant_auth_blocked_requests",
            "Requests refused with 429 because their source is blocked.",
            registry=self.registry,
        )


def _name(source: str) -> str:
    # Check keys may not hold whitespace; the hash tag keeps both keys of a source together.
    return "".join(source.split()) or "unknown"


class BruteForceGuard:
    def __init__(
        self,
        backend: QuotaBackend,
        policy: BruteForcePolicy | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        owns_backend: bool = False,
    ) -> None:
        self.backend = backend
        self._owns_backend = owns_backend
        self.policy = policy or BruteForcePolicy()
        self.metrics = BruteForceMetrics()
        self._monotonic = monotonic
        self._clear_until: OrderedDict[str, float] = OrderedDict()
        self._outage = OutageLog("brute-force guard store", log)

    def _failures(self, source: str) -> WindowCheck:
        # `limit` is max_failures - 1: the failure that would exceed it is the one that blocks.
        return WindowCheck(
            "auth_failures",
            f"{{auth:{_name(source)}}}:failures",
            self.policy.max_failures - 1,
            self.policy.window_s,
        )

    def _block(self, source: str, *, limit: int = 1, amount: int = 1) -> WindowCheck:
        return WindowCheck(
            "auth_block",
            f"{{auth:{_name(source)}}}:block",
            limit,
            self.policy.block_s,
            amount,
        )

    async def check(self, source: str) -> None:
        """Raise 429 (with Retry-After) when `source` is blocked; the key is not looked at."""
        now = self._monotonic()
        until = self._clear_until.get(source)
        if until is not None and until > now:
            return
        try:
            blocked = (await self.backend.usage(self._block(source))).used > 0
            retry_after = self.policy.block_s
            if blocked:
                # A zero-amount probe of a zero limit is refused while the block lasts (and
                # then says exactly when it ends); it consumes nothing.
                try:
                    await self.backend.admit([self._block(source, limit=0, amount=0)])
                    blocked = False
                except QuotaExceeded as refused:
                    retry_after = refused.refusal.retry_after_s or self.policy.block_s
        except Exception as exc:  # the store is down: do not lock everyone out
            self._outage.failure(exc, "not blocking sources")
            return
        self._outage.success()
        if blocked:
            self.metrics.refused.inc()
            raise RateLimited(BLOCKED_MESSAGE, code="auth_rate_limited", retry_after=retry_after)
        self._clear_until[source] = now + CLEAR_CACHE_S
        self._clear_until.move_to_end(source)
        while len(self._clear_until) > CLEAR_CACHE_MAX:
            self._clear_until.popitem(last=False)

    async def record_failure(self, source: str) -> None:
        """Count one failed key attempt; the one past the limit blocks the source."""
        self.metrics.failures.inc()
        try:
            await self.backend.admit([self._failures(source)])
            return
        except QuotaExceeded:
            pass
        except Exception as exc:
            self._outage.failure(exc, "not counting failed key attempts")
            return
        self._clear_until.pop(source, None)
        try:
            await self.backend.admit([self._block(source)])
        except QuotaExceeded:
            return  # already blocked (by a concurrent request or another gateway)
        except Exception as exc:
            self._outage.failure(exc, "not blocking sources")
            return
        self.metrics.blocks.inc()
        log.warning(
            "source blocked for failed key attempts",
            extra={"source": source, "block_s": self.policy.block_s},
        )

    async def aclose(self) -> None:
        """Close the store only when it is the guard's own (not the gateway's quota store)."""
        if self._owns_backend:
            await self.backend.aclose()


def build_brute_force_guard(
    settings: Settings, quota_backend: QuotaBackend | None = None
) -> BruteForceGuard:
    """On the gateway's quota store when there is one (Redis: shared by every gateway)."""
    policy = BruteForcePolicy(
        max_failures=settings.auth_max_failures,
        window_s=settings.auth_failure_window_s,
        block_s=settings.auth_block_s,
    )
    if quota_backend is not None:
        return BruteForceGuard(quota_backend, policy)
    return BruteForceGuard(InMemoryQuotaBackend(), policy, owns_backend=True)
