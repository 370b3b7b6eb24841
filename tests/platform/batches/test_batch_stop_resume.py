"""A batch stopped part way: cancelled (what was served is delivered and billed, nothing
else), or its runner cut off (a second runner finishes it without running or billing a
stored line again), or out of its window (expired, with the finished lines delivered);
and lines the engines cannot take yet (a pool waking) waiting rather than failing."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from batch_helpers import Gateway, chat_line, gateway, jsonl
from sqlalchemy import update
from sqlalchemy.exc import OperationalError

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Batch
from hydrant.platform.errors import ServiceUnavailable

# Lines that take a while (every one runs its 64 tokens), so a batch is caught mid-way.
LINES = [
    chat_line(f"q{i}", f"Write about the number {i}", max_tokens=64, ignore_eos=True)
    for i in range(16)
]
# The cancel and expiry tests' batches must still be running when the stop lands, however
# fast the engine: more and longer lines than a runner gets through between two polls (the
# runner notices a cancel or the window's end once a second, `runner.WATCH_EVERY_S`; on a
# fast host the 16 short lines above all ran in that time, and the expiry test's batch
# completed instead of expiring).
LONG_LINES = [
    chat_line(f"c{i}", f"Write about the number {i}", max_tokens=128, ignore_eos=True)
    for i in range(48)
]


async def _started_lines(gw: Gateway) -> list[str]:
    """Spy on the request path: the request id of every request it starts."""
    service = gw.services.inference.inference
    started: list[str] = []
    real = service.start

    async def start(ctx: Any, model: Any, **kwargs: Any) -> Any:
        started.append(ctx.request_id)
        return await real(ctx, model, **kwargs)

    service.start = start  # type: ignore[method-assign]
    return started


async def _when_completed(gw: Gateway, key: str, batch_id: str, at_least: int) -> None:
    for _ in range(600):
        got = (await gw.client.get(f"/v1/batches/{batch_id}", headers=gw.auth(key))).json()
        if got["request_counts"]["completed"] >= at_least:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the batch did not progress")


async def test_cancel_stops_the_batch_and_bills_only_what_was_served(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, batch_lane_slots=2) as gw:
        _, key = await gw.tenant("acme")
        batch = (await gw.create(key, jsonl(LONG_LINES))).json()
        await _when_completed(gw, key, batch["id"], 2)
        cancelling = await gw.client.post(f"/v1/batches/{batch['id']}/cancel", headers=gw.auth(key))
        assert cancelling.status_code == 200
        assert cancelling.json()["status"] in ("cancelling", "cancelled")
        done = await gw.wait(key, batch["id"])
        assert done["status"] == "cancelled" and done["cancelled_at"] is not None
        served = await gw.content(key, done["output_file_id"])
        counts = done["request_counts"]
        assert 2 <= counts["completed"] == len(served) < len(LONG_LINES)
        entries = await gw.ledger(batch_id=batch["id"])
        assert sorted(e.request_id for e in entries) == sorted(o["id"] for o in served)
        unrun = await gw.content(key, done["error_file_id"])
        assert {o["custom_id"] for o in unrun} | {o["custom_id"] for o in served} == {
            line["custom_id"] for line in LONG_LINES
        }
        assert all(o["error"]["code"] == "batch_cancelled" for o in unrun)
        again = await gw.client.post(f"/v1/batches/{batch['id']}/cancel", headers=gw.auth(key))
        assert again.json()["status"] == "cancelled"
        await asyncio.sleep(0.5)  # nothing more is billed after the end
        assert len(await gw.ledger(batch_id=batch["id"])) == len(entries)


async def test_a_runner_cut_off_is_resumed_without_running_a_stored_line_again(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, batch_lane_slots=2) as gw:
        _, key = await gw.tenant("acme")
        started = await _started_lines(gw)
        batch = (await gw.create(key, jsonl(LINES))).json()
        await _when_completed(gw, key, batch["id"], 3)
        scheduler = gw.services.background[0]

        # The runner dies with lines in flight, and the job loop with it: left running, its
        # sweep would start a runner of its own on the batch once its lease lapses, racing
        # the one this test drives (`not ours`, or SQLite locked). Stopped on the app's loop
        # (the portal's thread): Task.cancel is not thread-safe.
        await asyncio.to_thread(gw.client.blocking_portal.call, scheduler.stop)
        before = (await gw.client.get(f"/v1/batches/{batch['id']}", headers=gw.auth(key))).json()
        stored = before["request_counts"]["completed"]
        assert before["status"] == "in_progress" and 3 <= stored < len(LINES)
        # A runner that dies gives nothing back: its lease lapses (runner.LEASE) and the sweep
        # resumes the batch. The cancelled one here tries to give it back, but on a loaded
        # host that write can wait out SQLite's busy timeout behind the cancelled lines'
        # rollbacks (CI, stop 42): so the lease is made to lapse now, as after a crash.
        await _set_batch(gw, batch["id"], lease_until=utcnow() - timedelta(seconds=1))
        runner = gw.services.inference.runner
        outcome = await asyncio.to_thread(gw.client.blocking_portal.call, runner.run, batch["id"])
        assert outcome == "completed"
        done = await gw.wait(key, batch["id"])
        output = await gw.content(key, done["output_file_id"])
        assert sorted(o["custom_id"] for o in output) == sorted(x["custom_id"] for x in LINES)
        entries = await gw.ledger(batch_id=batch["id"])
        assert sorted(e.request_id for e in entries) == sorted(o["id"] for o in output)
        # A line stored before the cut was never started again; only lines cut mid-run were.
        assert len(started) - len(set(started)) <= len(LINES) - stored
        assert done["request_counts"] == {"total": len(LINES), "completed": len(LINES), "failed": 0}


async def _set_batch(gw: Gateway, batch_id: str, **values: Any) -> None:
    """Write the batch row's `values` on the app's loop (the portal's thread), waiting out a
    write lock that lines cancelled mid-write may still hold (SQLite's busy timeout, again)."""

    async def write() -> None:
        for attempt in range(1, 13):
            try:
                async with gw.services.database.session() as session:
                    await session.execute(update(Batch).where(Batch.id == batch_id).values(values))
                return
            except OperationalError:
                if attempt == 12:
                    raise
                await asyncio.sleep(0.5)

    await asyncio.to_thread(gw.client.blocking_portal.call, write)


async def test_a_batch_past_its_window_expires_with_its_finished_lines(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, batch_lane_slots=1) as gw:
        _, key = await gw.tenant("acme")
        batch = (await gw.create(key, jsonl(LONG_LINES))).json()
        await _when_completed(gw, key, batch["id"], 1)
        await _set_batch(gw, batch["id"], expires_at=utcnow() - timedelta(seconds=1))
        done = await gw.wait(key, batch["id"], timeout_s=60)
        assert done["status"] == "expired" and done["expired_at"] is not None
        served = await gw.content(key, done["output_file_id"])
        assert 1 <= len(served) < len(LONG_LINES)
        unrun = await gw.content(key, done["error_file_id"])
        assert all(o["error"]["code"] == "batch_expired" for o in unrun)
        assert len(served) + len(unrun) == len(LONG_LINES)
        entries = await gw.ledger(batch_id=batch["id"])
        assert len(entries) == len(served)


class _Waking:
    """An engine client that answers its first requests as a pool still waking does."""

    def __init__(self, inner: Any, refusals: int) -> None:
        self.inner = inner
        self.refusals = refusals

    def generate(self, request: Any) -> Any:
        if self.refusals > 0:
            self.refusals -= 1
            return self._refuse()
        return self.inner.generate(request)

    async def _refuse(self) -> Any:
        raise ServiceUnavailable("the pool is waking", code="pool_waking", retry_after=1)
        yield  # an async generator, as a client's stream is

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)


async def test_lines_the_engines_cannot_take_yet_are_retried_not_failed(
    data_dir: Path, demo_model_dir: Path
) -> None:
    lines = [chat_line(f"q{i}", f"hello {i}", max_tokens=4) for i in range(3)]
    async with gateway(data_dir, demo_model_dir) as gw:
        model = gw.services.inference.registry.get("demo")
        model.client = _Waking(model.client, refusals=4)  # type: ignore[assignment]
        _, key = await gw.tenant("acme")
        batch = (await gw.create(key, jsonl(lines))).json()
        done = await gw.wait(key, batch["id"], timeout_s=60)
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert done["error_file_id"] is None
        assert len(await gw.ledger(batch_id=batch["id"])) == 3
