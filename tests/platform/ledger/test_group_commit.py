from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hydrant.platform.ledger.group_commit import GroupCommit


async def test_concurrent_entries_share_flushes_and_all_land() -> None:
    flushed: list[list[dict[str, Any]]] = []

    async def flush(batch: list[dict[str, Any]]) -> None:
        await asyncio.sleep(0.01)  # a database round trip
        flushed.append(batch)

    commits = GroupCommit(flush)
    await asyncio.gather(*(commits.submit({"request_id": f"r{i}"}) for i in range(50)))
    ids = [raw["request_id"] for batch in flushed for raw in batch]
    assert sorted(ids) == sorted(f"r{i}" for i in range(50))
    assert len(flushed) < 50  # the first flush ran alone, the rest were grouped


async def test_a_failed_flush_fails_its_callers_and_the_next_one_runs() -> None:
    calls = 0

    async def flush(batch: list[dict[str, Any]]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database away")

    commits = GroupCommit(flush)
    with pytest.raises(ConnectionError):
        await commits.submit({"request_id": "a"})
    await commits.submit({"request_id": "b"})
    assert calls == 2


async def test_batches_are_bounded() -> None:
    sizes: list[int] = []

    async def flush(batch: list[dict[str, Any]]) -> None:
        sizes.append(len(batch))

    commits = GroupCommit(flush, max_batch=4)
    await asyncio.gather(*(commits.submit({"request_id": str(i)}) for i in range(10)))
    assert sum(sizes) == 10 and max(sizes) <= 4
