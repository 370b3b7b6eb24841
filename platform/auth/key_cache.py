"""A short-lived cache of authenticated keys, so hot keys skip the database on every request.

Why the TTL is capped at a few seconds: the cache is the only thing standing
between a revoked key and the database, and a gateway node cannot hear about a
revocation made on another node. A small TTL bounds how long a revoked key
keeps working everywhere. Entries are keyed by the key's HMAC digest (which is
also the stored hash), never by the public prefix: a prefix alone must never
authenticate, and a node that revokes a key can drop exactly that entry.

A hot key's entry is looked up again in the background once half its TTL is gone
(`refresh_due`, the authenticator's refresh-ahead), so a key in steady use never waits
for the database on a request: without it, one request per key and TTL paid a database
round trip on its way to the first token (4-12 ms on a 2-vCPU host, the tail of a
gateway's TTFT).
The bound on a revoked key is unchanged: an entry is still never served past its TTL.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")

MAX_TTL_S = 10.0
DEFAULT_TTL_S = 5.0


class KeyCache(Generic[V]):
    """LRU map from key digest to an auth record, each entry valid for `ttl_s` seconds."""

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        *,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < ttl_s <= MAX_TTL_S:
            raise ValueError(f"ttl_s must be in (0, {MAX_TTL_S}] so revocations take effect")
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()

    @property
    def ttl_s(self) -> float:
        return self._ttl

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str) -> V | None:
        """The cached record, or None when absent or older than the TTL."""
        item = self._entries.get(digest)
        if item is None:
            return None
        expires_at, value = item
        if self._clock() >= expires_at:
            del self._entries[digest]
            return None
        self._entries.move_to_end(digest)
        return value

    def refresh_due(self, digest: str) -> bool:
        """Whether a present entry has less than half its TTL left: time to look it up again
        while it still serves."""
        item = self._entries.get(digest)
        return item is not None and item[0] - self._clock() < self._ttl / 2

    def put(self, digest: str, value: V) -> None:
        """Remember a record for `ttl_s` from now, evicting the least recently used if full."""
        self._entries[digest] = (self._clock() + self._ttl, value)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def invalidate(self, digest: str) -> None:
        """Forget one key now (the node that revokes it need not wait for the TTL)."""
        self._entries.pop(digest, None)

    def clear(self) -> None:
        self._entries.clear()
