"""A gateway restarted mid-batch, against the same PostgreSQL and Redis: the second one
resumes the batch with the reservation its row says (whether Redis kept its copy or lost
it), never runs a line the first one stored, and when it ends the budgets hold nothing
for it and count exactly what its ledger entries charged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from batch_helpers import Gateway, chat_line, gateway, jsonl
from redis.asyncio import Redis
from sqlalchemy import select

from hydrant.platform.batches.reservation import from_json
from hydrant.platform.billing.money import to_micro_units
from hydrant.platform.db.models import Batch, BatchLine
from hydrant.platform.quotas import BudgetCheck, LimitUsage

pytestmark = pytest.mark.integration

LINES = [
    chat_line(f"q{i}", f"Write about the number {i}", max_tokens=48, ignore_eos=True)
    for i in range(12)
]
PLAN = {"spend_per_day": "100", "tokens_per_day": 10**6}


async def _call(gw: Gateway, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(gw.client.blocking_portal.call, fn, *args)


async def _row(gw: Gateway, batch_id: str) -> tuple[Batch, dict[int, Any]]:
    async def read() -> tuple[Batch, dict[int, Any]]:
        async with gw.services.database.session() as session:
            batch = await session.get(Batch, batch_id)
            lines = await session.execute(
                select(BatchLine.line, BatchLine.finished_at).where(BatchLine.batch_id == batch_id)
            )
            assert batch is not None
            return batch, {number: at for number, at in lines.all()}

    return await _call(gw, read)


async def _usage(gw: Gateway, checks: tuple[Any, ...]) -> dict[str, LimitUsage]:
    backend = gw.services.inference.quota_backend
    return {c.name: await _call(gw, backend.usage, c) for c in checks}


@pytest.mark.parametrize("redis_kept", [True, False], ids=["redis-kept", "redis-lost"])
async def test_a_restarted_gateway_resumes_the_batch_and_its_reservation_exactly(
    data_dir: Path,
    demo_model_dir: Path,
    fresh_postgres_url: str,
    redis_url: str,
    redis_kept: bool,
) -> None:
    shared = {"database_url": fresh_postgres_url, "redis_url": redis_url}
    async with gateway(data_dir, demo_model_dir, batch_lane_slots=2, **shared) as first:
        tenant_id, key = await first.tenant("acme", plan=PLAN)
        batch_id = (await first.create(key, jsonl(LINES))).json()["id"]
        for _ in range(600):  # until some lines are stored, then the runner dies mid-line
            row, _ = await _row(first, batch_id)
            if row.request_completed >= 3:
                break
            await asyncio.sleep(0.05)

        async def cut_off() -> None:
            """The runner and its job loop die with a line in flight (on the app's loop, the
            portal's thread: Task.cancel is not thread-safe)."""
            for scheduler in first.services.background:
                await scheduler.stop()

        await asyncio.to_thread(first.client.blocking_portal.call, cut_off)
        row, stored_before = await _row(first, batch_id)
        reservation = from_json(row.reservation)
        assert reservation is not None
        checks = reservation.checks
        assert row.status == "in_progress" and 3 <= len(stored_before) < len(LINES)
        assert row.quota_version == len(stored_before)
        kept = await _usage(first, checks)
        # Never less held than the row says, never more counted (a line stored as the runner
        # died may not have reached Redis yet: the next runner brings it there).
        assert kept["spend_day"].reserved >= row.held_micros > 0
        assert kept["spend_day"].used <= row.spent_micros

    if not redis_kept:  # Redis restarted without persistence: the budgets are gone
        client = Redis.from_url(redis_url)
        for check in checks:
            assert isinstance(check, BudgetCheck)
            await client.delete(
                f"hydrant:quota:{check.key}:bud", f"hydrant:quota:{check.key}:leases"
            )
        await client.aclose()

    # The second gateway: no job loop, its runner driven here, every line it starts seen.
    # (Its data folder is the first one's: the server secret that sealed the lines.)
    async with gateway(data_dir, demo_model_dir, embedded_jobs=False, **shared) as second:
        started: list[str] = []
        service = second.services.inference.inference
        real = service.start

        async def start(ctx: Any, model: Any, **kwargs: Any) -> Any:
            started.append(ctx.request_id)
            return await real(ctx, model, **kwargs)

        service.start = start  # type: ignore[method-assign]
        runner = second.services.inference.runner
        assert await _call(second, runner.run, batch_id) == "completed"
        done = await second.wait(key, batch_id)
        assert done["request_counts"] == {"total": len(LINES), "completed": len(LINES), "failed": 0}
        output = await second.content(key, done["output_file_id"])
        assert sorted(o["custom_id"] for o in output) == sorted(x["custom_id"] for x in LINES)
        row, stored_after = await _row(second, batch_id)
        for number, at in stored_before.items():
            assert stored_after[number] == at  # stored once, never again
        resumed = {int(rid.rsplit("_", 1)[-1]) for rid in started}
        assert resumed == set(range(1, len(LINES) + 1)) - set(stored_before)  # the rest only
        entries = await second.ledger(tenant_id=tenant_id)
        assert len(entries) == len({e.request_id for e in entries}) == len(LINES)
        assert sorted(e.request_id for e in entries) == sorted(o["id"] for o in output)
        spent = sum(to_micro_units(e.charged) for e in entries)
        tokens = sum(e.input_tokens + e.output_tokens for e in entries)
        assert (row.held_micros, row.held_tokens, row.spent_micros) == (0, 0, spent)
        assert await _usage(second, checks) == {
            "spend_day": LimitUsage(used=spent, reserved=0),
            "tokens_day": LimitUsage(used=tokens, reserved=0),
        }
