"""Journal mode (`HYDRANT_LEDGER_COMMIT=journal`): durable in the spool first, then in the database.

What must hold, as in database mode: an entry is durable before `record`
returns (so before the client's 200), a restart replays what was not moved
yet, nothing is counted twice, and a full journal refuses new work.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

import pytest
from ledger_requests import request_context
from sqlalchemy import func, select

from hydrant.engine.protocol import RequestUsage
from hydrant.errors import ConfigurationError
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import LedgerEntry, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.errors import ServiceUnavailable
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.ledger.spool_codec import decode_record
from hydrant.platform.quotas.admission import RequestContext
from hydrant.settings import load_settings

OUTCOME = Outcome(
    status="finished",
    usage=RequestUsage(prompt_tokens=3, cached_tokens=0, completion_tokens=4, device_ns=1000),
    finished_at=utcnow(),
)


def _ctx(request_id: str) -> RequestContext:
    return request_context(request_id, "ten_journal")


async def _rows(database: Database) -> list[str]:
    async with database.session() as session:
        return list(await session.scalars(select(LedgerEntry.request_id)))


async def _charged(database: Database) -> Decimal:
    async with database.session() as session:
        total = await session.scalar(select(func.coalesce(func.sum(LedgerEntry.charged), 0)))
        return Decimal(total)


async def _database(url: str) -> Database:
    database = Database(url)
    async with database.session() as session:
        session.add(Tenant(id="ten_journal", name="journal"))
    return database


def _journal(path: Path, database: Database, **spool: int) -> DatabaseLedger:
    return DatabaseLedger(
        database, LedgerSpool(path, **spool), DevicePrice(Decimal("1")), commit="journal"
    )


def test_the_setting_defaults_to_the_database_and_names_its_choices() -> None:
    assert load_settings({}).ledger_commit == "database"
    assert load_settings({"HYDRANT_LEDGER_COMMIT": "journal"}).ledger_commit == "journal"
    with pytest.raises(ConfigurationError, match=r"HYDRANT_LEDGER_COMMIT.*database, journal"):
        load_settings({"HYDRANT_LEDGER_COMMIT": "later"})


def test_an_unknown_commit_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="commit mode"):
        DatabaseLedger(
            Database("sqlite+aiosqlite://"),
            LedgerSpool(tmp_path / "s"),
            DevicePrice(Decimal("1")),
            commit="later",  # type: ignore[arg-type]
        )


async def test_a_recorded_entry_is_on_disk_and_a_restart_moves_it_once(
    database_url: str, tmp_path: Path
) -> None:
    database = await _database(database_url)
    path = tmp_path / "ledger.spool"
    try:
        ledger = _journal(path, database)
        await asyncio.gather(*(ledger.record(_ctx(f"r{i}"), OUTCOME) for i in range(20)))
        # Returned = durable: every entry is a complete record in the file, none in the database
        # yet (no mover runs here, as if the gateway died right after answering).
        on_disk = [decode_record(line)["request_id"] for line in path.read_bytes().splitlines(True)]
        assert sorted(on_disk) == sorted(f"r{i}" for i in range(20))
        assert await _rows(database) == []
        ledger.spool.close()

        restarted = _journal(path, database)  # a new process on the same data folder
        assert await restarted.replay_spool() == 20
        assert sorted(await _rows(database)) == sorted(f"r{i}" for i in range(20))
        assert restarted.spool.pending() == 0

        # The same entries replayed again (a crash between insert and compaction) add nothing.
        charged = await _charged(database)
        for i in range(20):
            restarted.spool.append(restarted._spool_entry(_ctx(f"r{i}"), OUTCOME))
        assert await restarted.replay_spool() == 20
        assert len(await _rows(database)) == 20
        assert await _charged(database) == charged
        restarted.spool.close()
    finally:
        await database.dispose()


async def test_entries_finishing_together_share_one_fsync(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = await _database(database_url)
    try:
        ledger = _journal(tmp_path / "ledger.spool", database)
        appends: list[int] = []
        real_append_many = ledger.spool.append_many

        def counted(entries: list[dict[str, object]]) -> None:
            appends.append(len(entries))
            real_append_many(entries)

        monkeypatch.setattr(ledger.spool, "append_many", counted)
        await asyncio.gather(*(ledger.record(_ctx(f"g{i}"), OUTCOME) for i in range(50)))
        assert sum(appends) == 50
        assert len(appends) < 50  # grouped: fewer writes (and fsyncs) than entries
        assert ledger.spool.pending() == 50
        ledger.spool.close()
    finally:
        await database.dispose()


async def test_the_mover_puts_every_entry_in_the_database_exactly_once(
    database_url: str, tmp_path: Path
) -> None:
    database = await _database(database_url)
    try:
        ledger = _journal(tmp_path / "ledger.spool", database)
        mover = asyncio.create_task(ledger.move_journal())
        try:
            for wave in range(3):
                await asyncio.gather(
                    *(ledger.record(_ctx(f"m{wave}_{i}"), OUTCOME) for i in range(30))
                )
            for _ in range(200):
                if len(await _rows(database)) == 90 and ledger.spool.size_bytes == 0:
                    break
                await asyncio.sleep(0.05)
        finally:
            mover.cancel()
            with pytest.raises(asyncio.CancelledError):
                await mover
        rows = await _rows(database)
        assert sorted(rows) == sorted(f"m{w}_{i}" for w in range(3) for i in range(30))
        assert ledger.spool.pending() == 0
        ledger.spool.close()
    finally:
        await database.dispose()


async def test_a_full_journal_refuses_work_until_the_mover_makes_room(
    database_url: str, tmp_path: Path
) -> None:
    database = await _database(database_url)
    try:
        ledger = _journal(tmp_path / "ledger.spool", database, max_bytes=2000)
        served: list[str] = []
        with pytest.raises(ServiceUnavailable) as refused:
            for i in range(100):
                await ledger.record(_ctx(f"f{i}"), OUTCOME)
                served.append(f"f{i}")
        assert refused.value.code == "ledger_unavailable"
        assert served, "the journal took no entry at all"
        with pytest.raises(ServiceUnavailable):  # new work is refused before it starts
            await ledger.ensure_recordable()

        assert await ledger.replay_spool() == len(served)
        await ledger.ensure_recordable()  # room again: accepted
        assert sorted(await _rows(database)) == sorted(served)  # the refused one is not there
        ledger.spool.close()
    finally:
        await database.dispose()


async def test_batched_replay_ends_a_batch_at_a_corrupt_line_and_quarantines_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.spool"
    with LedgerSpool(path) as spool:
        spool.append_many([{"request_id": f"a{i}"} for i in range(3)])
    with open(path, "ab") as handle:
        handle.write(b'00000000 {"request_id":"damaged"}\n')  # its checksum does not match
    with LedgerSpool(path) as spool:
        spool.append_many([{"request_id": f"b{i}"} for i in range(7)])
        batches: list[list[str]] = []

        async def sink(batch: list[dict[str, object]]) -> None:
            batches.append([str(entry["request_id"]) for entry in batch])

        result = await spool.replay_batches(sink, batch_size=4)
        assert batches == [["a0", "a1", "a2"], ["b0", "b1", "b2", "b3"], ["b4", "b5", "b6"]]
        assert (result.replayed, result.remaining, result.corrupt) == (10, 0, 1)
        assert result.error is None
        assert b"damaged" in spool.quarantine_path.read_bytes()
        assert spool.size_bytes == 0


async def test_a_failing_batch_stays_in_the_spool_with_what_follows(tmp_path: Path) -> None:
    with LedgerSpool(tmp_path / "ledger.spool") as spool:
        spool.append_many([{"request_id": f"r{i}"} for i in range(10)])
        seen: list[str] = []

        async def sink(batch: list[dict[str, object]]) -> None:
            if seen:
                raise ConnectionError("database gone")
            seen.extend(str(entry["request_id"]) for entry in batch)

        result = await spool.replay_batches(sink, batch_size=4)
        assert seen == ["r0", "r1", "r2", "r3"]
        assert (result.replayed, result.remaining) == (4, 6)
        assert isinstance(result.error, ConnectionError)
        kept = [
            decode_record(line)["request_id"] for line in spool.path.read_bytes().splitlines(True)
        ]
        assert kept == [f"r{i}" for i in range(4, 10)]
        with pytest.raises(ValueError, match="batch_size"):
            await spool.replay_batches(sink, batch_size=0)
