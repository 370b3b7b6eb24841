"""The ledger spool: durable appends, ordered idempotent replay, torn tails, a full disk."""

from __future__ import annotations

import errno
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from hydrant.platform.ledger import (
    LedgerSpool,
    SpoolError,
    SpoolFullError,
    SpoolLockedError,
)
from hydrant.platform.ledger import spool as spool_module
from hydrant.platform.ledger.spool_codec import encode_record


def entry(n: int) -> dict[str, Any]:
    return {
        "request_id": f"req-{n:04d}",
        "tenant_id": "t1",
        "tokens": {"input": n, "output": 2 * n},
        "charge": Decimal(n) / Decimal(1_000_000),
    }


class DictSink:
    """A fake ledger table: insert-if-absent by request id, like the real one."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.rows: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.fail_on = fail_on

    async def __call__(self, row: dict[str, Any]) -> bool:
        self.calls.append(row["request_id"])
        if row["request_id"] == self.fail_on:
            raise ConnectionError("database went away again")
        if row["request_id"] in self.rows:
            return False
        self.rows[row["request_id"]] = row
        return True


@pytest.fixture()
def path(data_dir: Path) -> Path:
    return data_dir / "spool" / "ledger.spool"


async def test_replay_delivers_in_order_exactly_and_empties_the_spool(path: Path) -> None:
    with LedgerSpool(path) as spool:
        for n in range(20):
            spool.append(entry(n))
        assert spool.pending() == 20
        sink = DictSink()
        result = await spool.replay(sink)
        assert (result.replayed, result.remaining, result.corrupt, result.error) == (20, 0, 0, None)
        assert sink.calls == [f"req-{n:04d}" for n in range(20)]
        assert sink.rows["req-0007"] == entry(7)
        assert isinstance(sink.rows["req-0007"]["charge"], Decimal)
        assert path.stat().st_size == 0
        again = await spool.replay(sink)
        assert again.replayed == 0
        assert len(sink.calls) == 20


async def test_entries_survive_reopening(path: Path) -> None:
    with LedgerSpool(path) as spool:
        spool.append(entry(1))
        spool.append(entry(2))
    with LedgerSpool(path) as spool:
        sink = DictSink()
        await spool.replay(sink)
    assert list(sink.rows) == ["req-0001", "req-0002"]


async def test_a_crash_before_compaction_resends_but_adds_nothing(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = DictSink()
    with LedgerSpool(path) as spool:
        for n in range(5):
            spool.append(entry(n))

        def crash(*args: object) -> None:
            raise KeyboardInterrupt  # the process dies after the sink, before compaction

        monkeypatch.setattr(spool, "_compact", crash)
        with pytest.raises(KeyboardInterrupt):
            await spool.replay(sink)
    assert len(sink.rows) == 5
    monkeypatch.undo()
    with LedgerSpool(path) as spool:
        result = await spool.replay(sink)
    assert result.replayed == 5
    assert len(sink.calls) == 10
    assert len(sink.rows) == 5


async def test_a_failing_sink_keeps_the_rest_in_order(path: Path) -> None:
    with LedgerSpool(path) as spool:
        for n in range(6):
            spool.append(entry(n))
        result = await spool.replay(DictSink(fail_on="req-0003"))
        assert (result.replayed, result.remaining) == (3, 3)
        assert isinstance(result.error, ConnectionError)
        spool.append(entry(6))
        sink = DictSink()
        await spool.replay(sink)
        assert sink.calls == ["req-0003", "req-0004", "req-0005", "req-0006"]


async def test_appends_during_a_replay_are_kept(path: Path) -> None:
    with LedgerSpool(path) as spool:
        spool.append(entry(0))
        spool.append(entry(1))

        async def sink_that_sees_new_traffic(row: dict[str, Any]) -> None:
            spool.append(entry(100 + int(row["request_id"][-1])))

        result = await spool.replay(sink_that_sees_new_traffic)
        assert (result.replayed, result.remaining) == (2, 2)
        sink = DictSink()
        await spool.replay(sink)
        assert sink.calls == ["req-0100", "req-0101"]


async def test_a_torn_last_record_is_cut_and_the_next_append_is_intact(path: Path) -> None:
    with LedgerSpool(path) as spool:
        spool.append(entry(1))
        spool.append(entry(2))
    whole = path.read_bytes()
    torn = encode_record(entry(3))[:-7]  # the process died mid-write
    path.write_bytes(whole + torn)
    with LedgerSpool(path) as spool:
        assert path.stat().st_size == len(whole)
        spool.append(entry(4))
        sink = DictSink()
        result = await spool.replay(sink)
    assert sink.calls == ["req-0001", "req-0002", "req-0004"]
    assert result.corrupt == 0


@pytest.mark.parametrize("junk", [b"\x00" * 4096, b"garbage-without-newline"])
async def test_a_torn_only_record_leaves_an_empty_spool(path: Path, junk: bytes) -> None:
    path.parent.mkdir(parents=True)
    path.write_bytes(junk)
    with LedgerSpool(path) as spool:
        assert spool.size_bytes == 0
        assert (await spool.replay(DictSink())).replayed == 0


async def test_a_damaged_complete_record_is_quarantined_not_lost(path: Path) -> None:
    with LedgerSpool(path) as spool:
        for n in range(3):
            spool.append(entry(n))
    lines = path.read_bytes().splitlines(keepends=True)
    damaged = lines[1].replace(b"req-0001", b"req-0009")
    path.write_bytes(lines[0] + damaged + lines[2])
    with LedgerSpool(path) as spool:
        sink = DictSink()
        result = await spool.replay(sink)
        assert (result.replayed, result.corrupt, result.remaining) == (2, 1, 0)
        assert sink.calls == ["req-0000", "req-0002"]
        assert spool.quarantine_path.read_bytes() == damaged


def test_the_size_cap_refuses_and_writes_nothing(path: Path) -> None:
    line = len(encode_record(entry(1)))
    with LedgerSpool(path, max_bytes=2 * line + 10) as spool:
        spool.append(entry(1))
        spool.append(entry(2))
        with pytest.raises(SpoolFullError, match="cap"):
            spool.append(entry(3))
        assert spool.size_bytes == 2 * line
        assert spool.pending() == 2


async def test_the_cap_frees_up_after_replay(path: Path) -> None:
    line = len(encode_record(entry(1)))
    with LedgerSpool(path, max_bytes=line) as spool:
        spool.append(entry(1))
        with pytest.raises(SpoolFullError):
            spool.append(entry(2))
        await spool.replay(DictSink())
        spool.append(entry(2))


def test_a_refusing_disk_is_spool_full_and_rolls_back(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with LedgerSpool(path) as spool:
        spool.append(entry(1))
        size = spool.size_bytes
        real_write = os.write

        def half_then_enospc(fd: int, data: Any) -> int:
            real_write(fd, bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(spool_module, "_write_all", half_then_enospc)
        with pytest.raises(SpoolFullError, match="No space left"):
            spool.append(entry(2))
        assert path.stat().st_size == size
        monkeypatch.undo()
        spool.append(entry(3))
        assert spool.pending() == 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_real_enospc_from_dev_full(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")
    with LedgerSpool(path) as spool:
        for _ in range(2):  # the second time through the "torn" path
            with pytest.raises(SpoolFullError):
                spool.append(entry(1))


def test_one_owner_at_a_time(path: Path) -> None:
    with LedgerSpool(path), pytest.raises(SpoolLockedError):
        LedgerSpool(path)
    LedgerSpool(path).close()


def test_closed_spool_refuses_appends(path: Path) -> None:
    spool = LedgerSpool(path)
    spool.close()
    with pytest.raises(SpoolError, match="closed"):
        spool.append(entry(1))


async def test_concurrent_replays_are_refused(path: Path) -> None:
    with LedgerSpool(path) as spool:
        spool.append(entry(1))

        async def nested(row: dict[str, Any]) -> None:
            with pytest.raises(SpoolError, match="already running"):
                await spool.replay(DictSink())

        assert (await spool.replay(nested)).replayed == 1
