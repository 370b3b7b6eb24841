"""Per-tenant fair share in front of upstream servers: a virtual token counter (VTC).

vLLM serves its queue first come, first served: a tenant that floods a pool
gets its share by volume and starves the others. Hydrant's own engine is fair
inside its scheduler; an upstream is not, so the gateway is fair before it:
it admits into each member a bounded number of in-flight tokens (prompt plus
`max_tokens` of every request it runs there, which is what a request may come
to hold in the member's KV cache, so the bound is on memory, not on a count
that one long request would overrun) and lets the rest wait here, where it
picks who goes next.

Who goes next is Sheng et al.'s "Fairness in Serving Large Language Models"
(OSDI '24): every tenant has a counter of the tokens it was served, divided
by its plan's `fair_share_weight`; the waiting request of the tenant with the
lowest counter goes first (within a tenant, first come first served). A
tenant that becomes active is lifted to the lowest counter of the tenants
active now, so time spent idle is not banked as credit to flood with later;
when nobody is active the counters are forgotten for the same reason.

Pure logic, no I/O and no clock: the pool (dispatch.pool) calls it when a
request waits, is admitted, streams tokens, and ends.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Ticket:
    """One request waiting for room on a member."""

    tenant: str
    weight: float
    seq: int
    admitted: bool = False


@dataclass
class VirtualTokenCounters:
    """Tokens served per tenant, each divided by its weight; lifted when a tenant arrives."""

    counters: dict[str, float] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)  # requests waiting or running

    def join(self, tenant: str) -> None:
        """A request of `tenant` arrives; a tenant new to the active set is lifted."""
        if self.active.get(tenant, 0) == 0:
            others = [self.counters.get(t, 0.0) for t in self.active]
            if others:
                self.counters[tenant] = max(self.counters.get(tenant, 0.0), min(others))
            self.counters.setdefault(tenant, 0.0)
        self.active[tenant] = self.active.get(tenant, 0) + 1

    def leave(self, tenant: str) -> None:
        """A request of `tenant` ended (or gave up waiting)."""
        left = self.active.get(tenant, 0) - 1
        if left > 0:
            self.active[tenant] = left
            return
        self.active.pop(tenant, None)
        if not self.active:
            self.counters.clear()  # nobody waits or runs: no history worth keeping

    def serve(self, tenant: str, weight: float, tokens: int) -> None:
        if tokens > 0:
            self.counters[tenant] = self.counters.get(tenant, 0.0) + tokens / max(weight, 1e-9)

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)


@dataclass
class FairQueue:
    """What waits for room on an upstream pool's members, and who is next.

    `member_tokens`: the in-flight tokens (prompt + max_tokens) this gateway
    admits into one member; a member running nothing takes any one request,
    however large, so nothing waits forever for room that cannot exist.
    `timeout_s`: the longest a request waits before it is refused.
    """

    member_tokens: int
    timeout_s: float
    vtc: VirtualTokenCounters = field(default_factory=VirtualTokenCounters)
    _waiting: dict[str, deque[Ticket]] = field(default_factory=dict)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    def fits(self, inflight: int, inflight_tokens: int, tokens: int) -> bool:
        return inflight == 0 or inflight_tokens + tokens <= self.member_tokens

    def enqueue(self, tenant: str, weight: float) -> Ticket:
        self.vtc.join(tenant)
        ticket = Ticket(tenant=tenant, weight=weight, seq=next(self._seq))
        self._waiting.setdefault(tenant, deque()).append(ticket)
        return ticket

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def is_next(self, ticket: Ticket) -> bool:
        """Whether `ticket` goes next: first of the waiting tenant with the lowest counter
        (ties: the tenant whose first request came first)."""
        head = min(
            (queue[0] for queue in self._waiting.values()),
            key=lambda t: (self.vtc.counter(t.tenant), t.seq),
            default=None,
        )
        return head is ticket

    def admit(self, ticket: Ticket) -> None:
        """`ticket` got room: it stops waiting (its tokens count as they are served)."""
        self._remove(ticket)
        ticket.admitted = True

    def abandon(self, ticket: Ticket) -> None:
        """`ticket` gave up waiting (timeout, client gone): it leaves without running."""
        if not ticket.admitted:
            self._remove(ticket)
            self.vtc.leave(ticket.tenant)

    def served(self, ticket: Ticket, tokens: int) -> None:
        """`tokens` more were served to an admitted request: its prompt when it is sent
        (prefill), then each token generated."""
        self.vtc.serve(ticket.tenant, ticket.weight, tokens)

    def finished(self, ticket: Ticket) -> None:
        """An admitted request ended (whatever the outcome)."""
        if ticket.admitted:
            ticket.admitted = False
            self.vtc.leave(ticket.tenant)

    def _remove(self, ticket: Ticket) -> None:
        queue = self._waiting.get(ticket.tenant)
        if queue is None:
            return
        try:
            queue.remove(ticket)
        except ValueError:
            return
        if not queue:
            del self._waiting[ticket.tenant]
