"""A batch is written `validating` (its reservation named on it, under its own id) before
the reservation is held, and only then started: a gateway that dies in between leaves a
batch the sweep finds once it is 5 minutes old, fails (`creation_interrupted`) and whose
reservation it gives back, held or not; a younger one (its creation may be going on) is
left alone. A batch refused at admission is never made."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from batch_helpers import Gateway, chat_line, gateway, jsonl
from sqlalchemy import select, update

from hydrant.platform.batches import repository
from hydrant.platform.batches.reservation import from_json
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import Batch
from hydrant.platform.quotas import LimitUsage

LINES = [chat_line(f"q{i}", f"count to {i}", max_tokens=8) for i in range(3)]


async def _call(gw: Gateway, fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(gw.client.blocking_portal.call, fn, *args)


async def _cut_short(gw: Gateway, batch_id: str, age: timedelta) -> Batch:
    """As the batch would be had its gateway died after holding the reservation."""

    async def write() -> Batch:
        async with gw.services.database.session() as session:
            await session.execute(
                update(Batch)
                .where(Batch.id == batch_id)
                .values(status="validating", in_progress_at=None, created_at=utcnow() - age)
            )
            found = await session.get(Batch, batch_id)
            assert found is not None
            return found

    return await _call(gw, write)


async def test_a_creation_cut_short_is_failed_and_its_reservation_given_back(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, embedded_jobs=False) as gw:
        _, key = await gw.tenant("acme", plan={"spend_per_day": "100"})
        first = (await gw.create(key, jsonl(LINES))).json()
        second = (await gw.create(key, jsonl(LINES))).json()
        assert first["status"] == second["status"] == "in_progress"
        stale = await _cut_short(gw, first["id"], timedelta(minutes=6))
        young = await _cut_short(gw, second["id"], timedelta(minutes=1))
        reservation = from_json(stale.reservation)
        assert reservation is not None and reservation.reservation_id == first["id"]
        (spend,) = reservation.checks
        backend = gw.services.inference.quota_backend
        both = stale.held_micros + young.held_micros
        assert await _call(gw, backend.usage, spend) == LimitUsage(used=0, reserved=both)

        async def unleased() -> list[str]:
            async with gw.services.database.session() as session:
                return await repository.unleased(session, utcnow())

        assert await _call(gw, unleased) == [first["id"]]  # what the sweep would enqueue
        runner = gw.services.inference.runner
        assert await _call(gw, runner.run, second["id"]) == "not ours"
        assert await _call(gw, runner.run, first["id"]) == "failed"
        failed = (await gw.client.get(f"/v1/batches/{first['id']}", headers=gw.auth(key))).json()
        assert failed["status"] == "failed"
        assert failed["errors"]["data"][0]["code"] == "creation_interrupted"
        assert await _call(gw, backend.usage, spend) == LimitUsage(
            used=0, reserved=young.held_micros
        )
        assert len(await gw.ledger(batch_id=first["id"])) == 0


async def test_a_batch_its_budget_refuses_is_never_made(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, embedded_jobs=False) as gw:
        _, key = await gw.tenant("poor", plan={"spend_per_day": "0.000001"})
        refused = await gw.create(key, jsonl(LINES))
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "spend_day"

        async def rows() -> list[str]:
            async with gw.services.database.session() as session:
                return list((await session.scalars(select(Batch.id))).all())

        assert await _call(gw, rows) == []  # not even a `validating` row is left

        listed = await gw.client.get("/v1/batches", headers=gw.auth(key))
        assert listed.json()["data"] == []
