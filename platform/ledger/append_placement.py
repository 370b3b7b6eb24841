"""Where the journal's write-and-fsync runs: on the event loop while the disk is fast, else
on a worker thread.

Why not always a thread: in journal mode every response waits for its entry's
fsync, and on a local SSD the fsync (0.15 ms on the machine `bench/gateway.py`
was tuned on) costs less than the hop to a worker thread and back, which wakes
the thread and then the loop through its self-pipe (~0.4 ms of each response's
time at 100–300 requests/s there). Why not always inline: a slow or stalling
disk (network storage, a saturated device) would block every request the loop
serves for as long as each fsync takes. So each append's own cost is measured
where it runs, and appends run inline only while a moving average of that cost
stays under `INLINE_BELOW_S`: one slow append moves the next ones onto the
thread, and fast ones (still measured there) bring them back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Entries = Sequence[Mapping[str, Any]]

# Under this moving-average cost, an append blocks the loop for less than a thread hop costs.
INLINE_BELOW_S = 0.001
# The weight of the newest append in the moving average: one 10 ms stall lifts it to 2 ms.
NEWEST_WEIGHT = 0.2


class AppendPlacement:
    """Runs `append(entries)` inline or on a thread, by its measured cost."""

    def __init__(
        self,
        append: Callable[[Entries], None],
        *,
        inline_below_s: float = INLINE_BELOW_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._append = append
        self.inline_below_s = inline_below_s
        self._clock = clock
        # Unknown until measured: the first append runs on the thread, and its cost decides.
        self.cost_s = inline_below_s

    @property
    def inline(self) -> bool:
        return self.cost_s < self.inline_below_s

    async def __call__(self, entries: Entries) -> None:
        if self.inline:
            self._timed(entries)
        else:
            await asyncio.to_thread(self._timed, entries)

    def _timed(self, entries: Entries) -> None:
        started = self._clock()
        try:
            self._append(entries)
        finally:
            # A float store, atomic under the GIL; a thread's append has finished by the
            # time the loop reads it for the next decision.
            self.cost_s += NEWEST_WEIGHT * (self._clock() - started - self.cost_s)
