"""A model's batch lane: Batch API lines run in the capacity interactive requests leave.

Why a lane in the gate as well as the engine's priority: the engine runs batch lines
as background work (paused, blocks kept, in every step where an interactive request
runs; preempted first), but starting a line costs the gateway CPU (preparing and
tokenizing it, storing the last one's result) and its prefill a step of its own. So the
gate also bounds how many lines of a model run at once (`slots`), and while any
interactive request of the model is in flight no new line starts once `busy_slots`
lines run (default 0: none). An interactive request is in flight from its admission
until its ledger entry is written (`Admission.close`): lines let go at its last token
would store their results in the same moment and queue its entry's write behind theirs.
Lines fill the gaps between interactive requests and give way as soon as one comes;
`bench/batch_interference.py` measures it. Lines wait for a place as long as it takes
(their batch has a day); nothing here refuses one.

Counted per gateway: another gateway's interactive requests reach the same workers
unseen here, and there the engine's priority alone keeps them first.
"""

from __future__ import annotations

import asyncio


class BatchLane:
    def __init__(self, slots: int, busy_slots: int) -> None:
        if slots < 1 or busy_slots < 0:
            raise ValueError("a batch lane needs slots >= 1 and busy_slots >= 0")
        self.slots = slots
        self.busy_slots = min(busy_slots, slots)
        self.running = 0  # batch lines holding a place
        self.interactive = 0  # interactive requests of the model in flight
        self._changed = asyncio.Event()

    @property
    def limit(self) -> int:
        """How many lines may run now: all the slots while the model is idle of interactive
        requests, `busy_slots` while any is in flight."""
        return self.busy_slots if self.interactive else self.slots

    async def enter(self) -> None:
        """Wait for a place (no timeout: a line's batch decides when to stop waiting)."""
        while self.running >= self.limit:
            self._changed.clear()  # nothing runs between this and the wait: no lost wake-up
            await self._changed.wait()
        self.running += 1

    async def quiet(self) -> None:
        """Until no interactive request of the model is in flight: when a batch runner does
        its own work (preparing the next lines, storing finished ones), so that its CPU
        lands in the gaps too."""
        while self.interactive:
            self._changed.clear()
            await self._changed.wait()

    def leave(self) -> None:
        self.running -= 1
        self._changed.set()

    def interactive_started(self) -> None:
        self.interactive += 1

    def interactive_ended(self) -> None:
        self.interactive -= 1
        if self.interactive == 0:
            self._changed.set()
