"""The admission path's arrival order: a FIFO gate of a few places, and the place a
request holds while it goes through the gateway's own work (platform/http/ingest.py
puts generation requests through it).

Why: every step of the admission path before the engine has the request (auth, the
brute-force check, the quota reservation in Redis, the dispatch to a worker) awaits I/O,
and asyncio resumes whatever is ready in FIFO order. A burst of 200 requests therefore
moves through the path in lockstep: each request's next step waits behind every other
request's current one, so the first reaches the engine only after nearly all of them
have done nearly all of their work (measured, issue #24: the 11th to the 200th of a
burst all reached the engine 376-428 ms after it began, and the engine had ten requests
to work on until then). With at most `limit` requests in the path at once, admitted in
arrival order, the first ones reach the engine within milliseconds and the rest follow
at the rate the gateway can admit them, while the engine is already computing.

A place is given up (`leave_ingest_gate`) once the quota gate has admitted the request,
or before anything that may wait for capacity (the long-request lane; the engine's own
queue, a cold worker come after admission), so waiting for capacity never holds up the
requests behind.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextvars import ContextVar, Token
from datetime import datetime

from hydrant.platform.db.base import utcnow

# The longest a request keeps its place. The admission path is the gateway's own work,
# milliseconds even in a burst; a request still in it after this waits on something slow
# (Redis or the database in an outage, up to their timeouts), and holding the place
# through that would make the requests behind wait for it in turn: the gate would turn
# a slow store into a queue of its own. So the place moves on and the request goes on
# without one, as every request did before the gate.
LEASE_S = 0.1


class IngestGate:
    """A FIFO gate of `limit` places: a freed place goes to the longest waiter, never to
    a request that arrived later (asyncio's Semaphore lets a newcomer take a place that
    was freed while the woken waiter had not run yet)."""

    def __init__(self, limit: int, lease_s: float = LEASE_S) -> None:
        if limit < 1:
            raise ValueError(f"an ingest gate needs at least one place, got {limit}")
        self.limit = limit
        self.lease_s = lease_s
        self._free = limit
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def in_use(self) -> int:
        return self.limit - self._free

    async def acquire(self) -> Place:
        arrived = utcnow()
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return Place(self, arrived)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._hand_on()  # the place was handed to us as we were cancelled: pass it on
            elif waiter in self._waiters:  # else a release already skipped it
                self._waiters.remove(waiter)
            raise
        return Place(self, arrived)

    def _hand_on(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the place moves to it: `_free` is unchanged
                return
        self._free += 1


class Place:
    """One request's place in the gate, released by the request or at the end of its
    lease (`LEASE_S`), whichever comes first; releasing it twice is harmless."""

    def __init__(self, gate: IngestGate, arrived: datetime) -> None:
        self._gate: IngestGate | None = gate
        self.arrived = arrived  # when it asked for the place: its wait is gateway time
        self._lease = asyncio.get_running_loop().call_later(gate.lease_s, self.release)

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            self._lease.cancel()
            gate._hand_on()


_place: ContextVar[Place | None] = ContextVar("hydrant_ingest_place", default=None)


def arrival() -> datetime | None:
    """When the current request asked for its place (None: it took none), so its wait
    counts as its own time in the gateway (`RequestContext.started_at`)."""
    place = _place.get()
    return None if place is None else place.arrived


def hold_place(place: Place) -> Token[Place | None]:
    """Make `place` the current request's (its task and the tasks it starts)."""
    return _place.set(place)


def drop_place(token: Token[Place | None]) -> None:
    _place.reset(token)


def leave_ingest_gate() -> None:
    """Give up this request's place (if it holds one): it is admitted, or about to wait
    for something other than the gateway's own work. Tasks the request started see the
    same place (contextvars are copied into them), so any of them may call this."""
    place = _place.get()
    if place is not None:
        place.release()


def admission_alone() -> bool:
    """Whether the current request goes through the admission path with nobody beside it
    or behind it: no other request holds a place or waits for one. Then a quota call made
    inline (quotas/inline_redis.py) holds up nobody; with others in the path, their calls
    go out together through the loop, and inline calls would make them one after another
    (a burst of 50 measured 44 ms of gateway time through the loop, 57-62 ms inline).

    A request that took no place (the gate is off, or the request is not a generation)
    counts as alone; one whose place went back before this (its lease ran out: the path is
    slow now) does not."""
    place = _place.get()
    if place is None:
        return True
    gate = place._gate
    return gate is not None and gate.in_use == 1 and not gate.waiting
