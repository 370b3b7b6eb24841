"""Device time of upstream requests: an estimate, apportioned by concurrent tokens.

A Hydrant worker measures each request's share of every batch step; an
upstream server does not report one. The gateway knows what it has in flight
on each member, so it splits the member's wall time while busy among its
requests in proportion to their tokens (prompt plus tokens generated so far),
like the engine's own apportioning by tokens in each step. It is an estimate:
another gateway's requests on the same member are not seen, so each gateway
charges its requests the whole member time they overlapped; the ledger's
device cost of upstream models is marked as such in the README.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Share:
    tokens: int
    seconds: float = 0.0


@dataclass
class MemberCost:
    """One member's requests in flight and the device seconds each has accrued."""

    clock: Callable[[], float] = time.monotonic
    _active: dict[str, _Share] = field(default_factory=dict)
    _last: float = 0.0

    def _advance(self) -> None:
        now = self.clock()
        elapsed, self._last = now - self._last, now
        total = sum(share.tokens for share in self._active.values())
        if elapsed <= 0 or total <= 0:
            return
        for share in self._active.values():
            share.seconds += elapsed * share.tokens / total

    def start(self, request_id: str, prompt_tokens: int) -> None:
        self._advance()
        self._active[request_id] = _Share(tokens=max(1, prompt_tokens))

    def grow(self, request_id: str, new_tokens: int) -> None:
        """`new_tokens` more generated: the request's weight from now on."""
        share = self._active.get(request_id)
        if share is not None and new_tokens:
            self._advance()
            share.tokens += new_tokens

    def finish(self, request_id: str) -> float:
        """The request's estimated device seconds; it leaves the member's accounting."""
        self._advance()
        share = self._active.pop(request_id, None)
        return share.seconds if share is not None else 0.0
