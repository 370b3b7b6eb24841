"""The admission path's FIFO gate: places go to waiters in arrival order, never to a
latecomer, and neither a cancelled waiter nor a double release loses or makes a place; a
request knows whether others are in the path with it (`admission_alone`)."""

from __future__ import annotations

import asyncio

import pytest

from hydrant.platform.quotas.ingest_order import (
    IngestGate,
    Place,
    admission_alone,
    drop_place,
    hold_place,
    leave_ingest_gate,
)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_places_go_to_waiters_in_arrival_order() -> None:
    gate = IngestGate(2)
    first, second = await gate.acquire(), await gate.acquire()
    order: list[int] = []

    async def wait(n: int) -> Place:
        place = await gate.acquire()
        order.append(n)
        return place

    waiters = [asyncio.create_task(wait(n)) for n in range(4)]
    await _settle()
    assert order == [] and gate.waiting == 4 and gate.in_use == 2
    first.release()
    await _settle()
    assert order == [0]
    # freed while the woken waiter has not run yet: a newcomer must not take it
    second.release()
    late = asyncio.create_task(wait(99))
    await _settle()
    assert order == [0, 1]
    for task in waiters[:2]:
        (await task).release()
    await _settle()
    assert order == [0, 1, 2, 3]
    for task in waiters[2:]:
        (await task).release()
    await _settle()
    assert order == [0, 1, 2, 3, 99]
    (await late).release()
    assert gate.in_use == 0 and gate.waiting == 0


async def test_releasing_twice_frees_one_place() -> None:
    gate = IngestGate(1)
    place = await gate.acquire()
    place.release()
    place.release()
    assert gate.in_use == 0
    again = await gate.acquire()
    assert gate.in_use == 1
    blocked = asyncio.create_task(gate.acquire())
    await _settle()
    assert not blocked.done()  # the double release did not make a second place
    again.release()
    (await blocked).release()


async def test_a_cancelled_waiter_loses_no_place() -> None:
    gate = IngestGate(1)
    held = await gate.acquire()
    cancelled = asyncio.create_task(gate.acquire())
    behind = asyncio.create_task(gate.acquire())
    await _settle()
    cancelled.cancel()
    await _settle()
    assert gate.waiting == 1
    held.release()
    place = await asyncio.wait_for(behind, 1)
    place.release()
    assert gate.in_use == 0


async def test_a_place_handed_over_as_its_waiter_is_cancelled_goes_on() -> None:
    gate = IngestGate(1)
    held = await gate.acquire()
    cancelled = asyncio.create_task(gate.acquire())
    behind = asyncio.create_task(gate.acquire())
    await _settle()
    held.release()  # hands the place to `cancelled`'s future...
    cancelled.cancel()  # ...which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    place = await asyncio.wait_for(behind, 1)
    assert gate.in_use == 1
    place.release()
    assert gate.in_use == 0


async def test_the_current_place_is_left_from_tasks_the_request_started() -> None:
    gate = IngestGate(1)
    token = hold_place(await gate.acquire())
    try:
        await asyncio.create_task(asyncio.to_thread(lambda: None))  # a context copy
        await asyncio.create_task(_leave())
        assert gate.in_use == 0
        leave_ingest_gate()  # again, and outside any request: harmless
    finally:
        drop_place(token)
    leave_ingest_gate()
    assert gate.in_use == 0


async def _leave() -> None:
    leave_ingest_gate()


def test_a_gate_needs_a_place() -> None:
    with pytest.raises(ValueError, match="at least one place"):
        IngestGate(0)


async def test_a_place_held_past_its_lease_moves_on() -> None:
    """A request stuck in the path (its store slow to answer) does not hold up the ones
    behind it for longer than the lease."""
    gate = IngestGate(1, lease_s=0.05)
    stuck = await gate.acquire()
    behind = asyncio.create_task(gate.acquire())
    await _settle()
    assert not behind.done()
    place = await asyncio.wait_for(behind, 1)
    assert gate.in_use == 1
    stuck.release()  # late: it was released already, nothing changes
    assert gate.in_use == 1
    place.release()
    assert gate.in_use == 0


async def test_a_request_is_alone_in_the_path_only_while_no_other_holds_or_waits() -> None:
    assert admission_alone()  # no place taken: no gate, or not a generation request
    gate = IngestGate(2)
    mine = await gate.acquire()
    token = hold_place(mine)
    try:
        assert admission_alone()
        other = await gate.acquire()  # beside it
        assert not admission_alone()
        other.release()
        assert admission_alone()
        other = await gate.acquire()
        behind = asyncio.create_task(gate.acquire())  # the gate is full: it waits
        await _settle()
        assert gate.waiting == 1 and not admission_alone()
        other.release()  # its place goes to the one behind
        (await behind).release()
        assert gate.waiting == 0 and gate.in_use == 1
        assert admission_alone()
        mine.release()  # admitted, or its lease ran out: no longer in the path
        assert not admission_alone()
    finally:
        drop_place(token)
    assert admission_alone()
