"""Where the journal's append runs: inline while its measured cost is low, else on a thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from hydrant.platform.ledger.append_placement import AppendPlacement


class _Disk:
    """An append whose cost is set by the test, read off a fake clock it advances."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cost_s = 0.0001
        self.threads: list[int] = []
        self.written: list[Any] = []
        self.fail = False

    def clock(self) -> float:
        return self.now

    def append(self, entries: Sequence[Mapping[str, Any]]) -> None:
        self.threads.append(threading.get_ident())
        self.now += self.cost_s
        if self.fail:
            raise OSError("disk gone")
        self.written.extend(entries)


async def _appends(placement: AppendPlacement, disk: _Disk, n: int) -> list[bool]:
    """Run `n` appends; for each, whether it ran on the loop's thread."""
    loop_thread = threading.get_ident()
    start = len(disk.threads)
    for i in range(n):
        await placement([{"request_id": f"r{i}"}])
    return [ident == loop_thread for ident in disk.threads[start:]]


async def test_a_fast_disk_moves_appends_onto_the_loop_after_the_first() -> None:
    disk = _Disk()
    placement = AppendPlacement(disk.append, clock=disk.clock)
    assert not placement.inline  # nothing measured yet
    assert await _appends(placement, disk, 5) == [False, True, True, True, True]
    assert len(disk.written) == 5


async def test_one_slow_append_sends_the_next_to_a_thread_and_fast_ones_bring_them_back() -> None:
    disk = _Disk()
    placement = AppendPlacement(disk.append, clock=disk.clock)
    await _appends(placement, disk, 3)
    assert placement.inline
    disk.cost_s = 0.02  # a stalling disk: one append of 20 ms
    assert await _appends(placement, disk, 1) == [True]  # it was inline when it started
    assert not placement.inline
    disk.cost_s = 0.0001
    placed = await _appends(placement, disk, 40)
    assert placed[0] is False  # after the stall, on the thread
    assert placed[-1] is True  # measured fast again there: back on the loop
    assert placed.index(True) > 1  # not at once: the average remembers the stall


async def test_a_disk_that_stays_slow_keeps_appends_off_the_loop() -> None:
    disk = _Disk()
    disk.cost_s = 0.003
    placement = AppendPlacement(disk.append, clock=disk.clock)
    assert await _appends(placement, disk, 10) == [False] * 10


async def test_an_append_error_reaches_the_caller_and_still_counts_its_time() -> None:
    disk = _Disk()
    placement = AppendPlacement(disk.append, clock=disk.clock)
    await _appends(placement, disk, 2)
    disk.fail, disk.cost_s = True, 0.05
    with pytest.raises(OSError, match="disk gone"):
        await placement([{"request_id": "x"}])
    assert not placement.inline


async def test_inline_appends_do_not_yield_to_other_tasks() -> None:
    """An inline append finishes before any other task runs: the group commit relies on a
    flush's entries being durable when its awaiting callers resume, not on the ordering,
    but a stray yield would reintroduce the loop hop this exists to save."""
    disk = _Disk()
    placement = AppendPlacement(disk.append, clock=disk.clock)
    await _appends(placement, disk, 1)
    events: list[str] = []

    async def other() -> None:
        events.append("other")

    task = asyncio.ensure_future(other())
    await placement([{"request_id": "y"}])
    events.append("appended")
    await task
    assert events == ["appended", "other"]
