"""The worker timeline: what devices the pools held, in which state, from the registry.

The rule. A worker stamps `state_since` (its own wall clock) each time its state
changes and publishes at once; every heartbeat carries it. The timeline keeps one
interval per (worker, state, state_since): it starts at `state_since`, its end is moved
to the latest `heartbeat_at` seen in that state, and when a later state appears the
interval before it is closed at the later state's `state_since` (the worker held its
device in the old state until that moment). So:

- the intervals of a worker tile its life from its first recorded state to its last
  heartbeat seen, with no gap and no overlap, whatever the sampling rate;
- a gateway restart (or all of them) loses nothing: the next sample of a worker still in
  the same state stretches the same interval over the gap, because a worker alive in
  one state since `state_since` held its device all along;
- what is missed is only the tail of a worker that died or stopped when no gateway
  sampled it: its time after the last heartbeat recorded (at most one sampling period
  while a gateway runs), and a state that began and ended between two samples, which is
  counted as the state before it.

Every gateway with pools records (`PoolManager` calls `record` every
`HYDRANT_TIMELINE_SAMPLE_S`); the writes only move ends later, so several gateways
recording the same worker leave the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.db.session import Database
from hydrant.platform.reconciliation.repository import record_states


class TimelineRecorder:
    def __init__(self, database: Database) -> None:
        self.database = database

    async def record(self, records: Sequence[WorkerRecord]) -> int:
        async with self.database.session() as session:
            return await record_states(session, records)
