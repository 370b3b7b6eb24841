"""The end of a batch: its output and error files written, its reservation settled, its
final status (`completed`, `cancelled`, `expired`, or `failed`) set.

Safe to run again: a finish cut short leaves the batch `finalizing` (or still
`cancelling`), and the next runner finishes it; files written by the first attempt
and never named by the batch just expire. The reservation's remainder is given back
by bringing the store to the batch's final state (nothing held, what the lines used
counted), which changes nothing the second time.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import update

from hydrant.platform.batches import repository
from hydrant.platform.batches.lines import ENDPOINTS, InputLine, read_lines
from hydrant.platform.batches.output import LineSealer, line_request_id, not_run
from hydrant.platform.batches.reservation import HeldState, resync
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.batch_models import Batch
from hydrant.platform.db.session import Database
from hydrant.platform.errors import NotFound
from hydrant.platform.files.service import OUTPUT_PURPOSE, FileStore
from hydrant.platform.quotas import QuotaBackend
from hydrant.platform.sealing import Unopenable

log = logging.getLogger(__name__)

_OPEN = ("validating", "in_progress", "cancelling", "finalizing")


class Finisher:
    def __init__(
        self, database: Database, files: FileStore, backend: QuotaBackend, sealer: LineSealer
    ) -> None:
        self._database = database
        self._files = files
        self._backend = backend
        self._sealer = sealer

    async def finish(self, batch: Batch, how: str) -> str:
        """`how`: completed, cancelled or expired. Lines never run go to the error file."""
        if how == "completed":
            async with self._database.session() as session:
                await session.execute(
                    update(Batch)
                    .where(Batch.id == batch.id, Batch.status.in_(_OPEN))
                    .values(status="finalizing", finalizing_at=batch.finalizing_at or utcnow())
                )
        await self._end(batch, how, None if how == "completed" else how)
        log.info("batch finished", extra={"batch_id": batch.id, "status": how})
        return how

    async def fail(self, batch: Batch, code: str, message: str) -> str:
        """A batch that cannot go on (its input file was deleted): `failed`, with what it
        served delivered."""
        errors = [{"code": code, "message": message, "param": None, "line": None}]
        await self._end(batch, "failed", None, errors=errors)
        return "failed"

    async def _end(
        self, batch: Batch, status: str, not_run_because: str | None, **more: Any
    ) -> None:
        output, errors = await self._lines(batch, not_run_because)
        values: dict[str, Any] = {
            "status": status,
            f"{status}_at": utcnow(),
            "enqueued_tokens": 0,
            "lease_owner": None,
            "lease_until": None,
            **more,
        }
        if output:
            values["output_file_id"] = await self._save(batch, "output", output)
        if errors:
            values["error_file_id"] = await self._save(batch, "error", errors)
        await self._settle(batch)
        async with self._database.session() as session:
            await session.execute(
                update(Batch).where(Batch.id == batch.id, Batch.status.in_(_OPEN)).values(**values)
            )

    async def _lines(self, batch: Batch, not_run_because: str | None) -> tuple[bytes, bytes]:
        """The output file's lines and the error file's, in the input file's order."""
        async with self._database.session() as session:
            rows = await repository.finished_lines(session, batch.id)
        done = {row.line for row in rows}
        output: list[bytes] = []
        errors: list[bytes] = []
        for row in rows:
            try:
                line = await asyncio.to_thread(
                    self._sealer.open, batch.tenant_id, batch.id, row.line, row.sealed
                )
            except Unopenable:  # sealed under another server secret: not deliverable
                log.warning("a batch line could not be opened", extra={"batch_id": batch.id})
                continue
            (output if 200 <= row.status_code < 300 else errors).append(line)
        if not_run_because is not None:
            errors.extend(await self._not_run(batch, done, not_run_because))
        return _jsonl(output), _jsonl(errors)

    async def _not_run(self, batch: Batch, done: set[int], why: str) -> list[bytes]:
        try:
            content = await self._files.content(batch.tenant_id, batch.input_file_id)
        except NotFound:
            return []
        endpoint = ENDPOINTS[batch.endpoint]
        return [
            not_run(line.custom_id, line_request_id(batch.id, line.number), why)
            for line in read_lines(content, batch.endpoint, endpoint)
            if isinstance(line, InputLine) and line.number not in done
        ]

    async def _save(self, batch: Batch, kind: str, content: bytes) -> str:
        """A file of the batch's, expiring as its `output_expires_after` says (else after
        the files' retention)."""
        seconds = batch.output_expires_after_s
        row = await self._files.save(
            batch.tenant_id,
            filename=f"{batch.id}_{kind}.jsonl",
            purpose=OUTPUT_PURPOSE,
            content=content,
            expires_after=timedelta(seconds=seconds) if seconds is not None else None,
        )
        return row.id

    async def _settle(self, batch: Batch) -> None:
        """Nothing held any more; what the lines used stays counted (the row as it is now:
        the `batch` handed in may predate its last lines)."""
        async with self._database.session() as session:
            now = await session.get(Batch, batch.id)
        if now is not None:
            await self.resync(now.reservation, HeldState.of(now).ended())

    async def resync(self, reservation: dict[str, Any] | None, state: HeldState) -> None:
        """The quota store's copy of a batch's reservation brought to `state` (see
        reservation.py): after each stored line, when a runner takes a batch up, at its end."""
        await resync(self._backend, reservation, state)


def _jsonl(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)
