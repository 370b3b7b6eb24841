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
    mark: float  # the member's seconds-per-token integral when `seconds` was last settled
    seconds: float = 0.0


@dataclass
class MemberCost:
    """One member's requests in flight and the device seconds each has accrued.

    O(1) per event, whatever the number in flight: the member keeps the integral
    of wall time per token in flight (`_per_token`), and a request's share over
    any stretch in which its tokens did not change is its tokens times that
    integral's growth. A per-event loop over every request in flight cost the
    gateway 4 % of its CPU at 20 requests/s (py-spy), quadratic in the load.
    """

    clock: Callable[[], float] = time.monotonic
    _active: dict[str, _Share] = field(default_factory=dict)
    _total: int = 0  # tokens in flight
    _per_token: float = 0.0
    _last: float = 0.0

    def _advance(self) -> None:
        now = self.clock()
        elapsed, self._last = now - self._last, now
        if elapsed > 0 and self._total > 0:
            self._per_token += elapsed / self._total

    def _settle(self, share: _Share) -> None:
        share.seconds += share.tokens * (self._per_token - share.mark)
        share.mark = self._per_token

    def start(self, request_id: str, prompt_tokens: int) -> None:
        self._advance()
        share = _Share(tokens=max(1, prompt_tokens), mark=self._per_token)
        self._active[request_id] = share
        self._total += share.tokens

    def grow(self, request_id: str, new_tokens: int) -> None:
        """`new_tokens` more generated: the request's weight from now on."""
        share = self._active.get(request_id)
        if share is not None and new_tokens:
            self._advance()
            self._settle(share)
            share.tokens += new_tokens
            self._total += new_tokens

    def finish(self, request_id: str) -> float:
        """The request's estimated device seconds; it leaves the member's accounting."""
        share = self._active.pop(request_id, None)
        if share is None:
            return 0.0
        self._advance()
        self._settle(share)
        self._total -= share.tokens
        if not self._active:
            self._per_token = 0.0  # no mark refers to it: start afresh (no drift over months)
        return share.seconds
