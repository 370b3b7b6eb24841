"""The worker timeline from registry records, on SQLite and the real PostgreSQL: two
gateways recording the same worker, out of order, with a restart's gap between samples,
leave intervals that tile the worker's life exactly (recorder.py states the rule)."""

from __future__ import annotations

import random
from datetime import UTC, datetime

from sqlalchemy import select

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.db.models import WorkerStateInterval
from hydrant.platform.db.session import Database
from hydrant.platform.reconciliation.recorder import TimelineRecorder

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC).timestamp()
# (state, entered at seconds after start): loading, ready, asleep, ready, draining.
LIFE = [("starting", 0.0), ("ready", 20.5), ("sleeping", 1800.25), ("ready", 2400.0)]
LIFE += [("draining", 3600.125)]
LAST_BEAT = 3605.5  # then the worker died: no deregistration


def record(worker: str, at: float, *, model: str = "tiny", kind: str = "hydrant") -> WorkerRecord:
    """The worker's record as a heartbeat at `at` seconds after its start publishes it."""
    state, since = next((s, t) for s, t in reversed(LIFE) if t <= at)
    return WorkerRecord(
        worker_id=worker,
        model=model,
        address="http://127.0.0.1:1",
        device="cpu",
        state=state,  # type: ignore[arg-type]  # from LIFE: registry states
        path="/models/tiny",
        kind=kind,  # type: ignore[arg-type]
        started_at=T0,
        heartbeat_at=T0 + at,
        state_since=T0 + since,
    )


def moment(offset: float) -> datetime:
    return datetime.fromtimestamp(T0 + offset, UTC)


async def intervals(db: Database) -> list[tuple[str, datetime, datetime]]:
    async with db.session() as session:
        rows = await session.execute(
            select(WorkerStateInterval).order_by(WorkerStateInterval.started_at)
        )
        return [(r.state, r.started_at, r.ended_at) for r in rows.scalars()]


def expected(sampled_states: list[int]) -> list[tuple[str, datetime, datetime]]:
    """Loading, then every state sampled, each until the next one began; the last until
    the last heartbeat."""
    kept = sorted({0, *sampled_states})
    out = []
    for n, index in enumerate(kept):
        state, since = LIFE[index]
        end = LIFE[kept[n + 1]][1] if n + 1 < len(kept) else LAST_BEAT
        out.append((state, moment(since), moment(end)))
    return out


async def test_two_gateways_out_of_order_with_a_gap_tile_the_life(db: Database) -> None:
    # Gateway A samples every 5 s but was down from 100 s to 3000 s (a restart); gateway B
    # samples every 7 s and writes its samples shuffled (a slow writer), both to the end.
    a = [t for t in range(0, 3606, 5) if not 100 <= t < 3000]
    b = list(range(3, 3606, 7))
    random.Random(3).shuffle(b)
    first, second = TimelineRecorder(db), TimelineRecorder(db)
    for at_a, at_b in zip(a, b, strict=False):
        await first.record([record("w1", float(at_a))])
        await second.record([record("w1", float(at_b))])
    for at in b[len(a) :]:
        await second.record([record("w1", float(at))])
    await first.record([record("w1", LAST_BEAT)])  # the last heartbeat, seen once

    assert await intervals(db) == expected([1, 2, 3, 4])
    # Recording everything again changes nothing.
    for at in [*a, *b]:
        await first.record([record("w1", float(at))])
    await first.record([record("w1", LAST_BEAT)])
    assert await intervals(db) == expected([1, 2, 3, 4])


async def test_first_seen_ready_counts_its_loading_and_a_missed_state_the_one_before(
    db: Database,
) -> None:
    # No gateway ran while it loaded; the sleep from 1800 s to 2400 s fell in a gap.
    recorder = TimelineRecorder(db)
    for at in (30.0, 900.0, 1700.0, 2500.0, 3000.0, 3601.0, LAST_BEAT):
        await recorder.record([record("w2", at)])
    # Asleep never sampled: counted as ready (the state before it), as the rule says.
    assert await intervals(db) == expected([1, 3, 4])


async def test_upstream_members_are_not_recorded(db: Database) -> None:
    written = await TimelineRecorder(db).record([record("u1", 30.0, kind="openai")])
    assert written == 0 and await intervals(db) == []
