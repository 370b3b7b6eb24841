"""How services tell the auth cache that what it holds is stale.

Why services call this at all when the TTL bounds staleness anyway: on the
node where an admin revokes a key or suspends a tenant, the change should hold
for the very next request. Other nodes converge within the TTL.
"""

from __future__ import annotations

from typing import Protocol


class CacheInvalidator(Protocol):
    """What `KeyCache` offers; services depend on this much of it."""

    def invalidate(self, digest: str) -> None: ...

    def clear(self) -> None: ...


class _NoCache:
    """For callers with no auth cache in their process (the console)."""

    def invalidate(self, digest: str) -> None:
        return None

    def clear(self) -> None:
        return None


no_cache: CacheInvalidator = _NoCache()
