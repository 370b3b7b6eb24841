"""Write each request's one ledger entry: to the database, or to the spool when it is down.

The entry is priced here at the price version in force when the request
started, with the engine's measured device-seconds costed at the configured
device price, so reports can show revenue, cost and margin from one row.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy.exc import DataError, IntegrityError

from hydrant.platform.billing.device import DevicePrice, device_cost, seconds_from_ns
from hydrant.platform.billing.pricing import Price, TokenUsage, charge_for
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.inference.accounting import Outcome, RequestContext
from hydrant.platform.ledger import repository
from hydrant.platform.ledger.group_commit import GroupCommit
from hydrant.platform.ledger.repository import PriceVersion
from hydrant.platform.ledger.spool import LedgerSpool

log = logging.getLogger(__name__)

UNAVAILABLE = DATABASE_UNAVAILABLE
# The database answered and said no: retrying will not help, spooling would block replay.
REFUSED = (IntegrityError, DataError)

# A live write that takes longer goes to the spool. Why: the response waits for its
# entry, and a database that stops answering without refusing (a network partition)
# would otherwise hang every request. The slow write is left to finish, not cancelled
# (cancelling would wait on the same dead connection to roll back); whichever of it
# and the spool's replay lands second inserts nothing.
LIVE_WRITE_TIMEOUT_S = 2.0
# Past this many slow writes still running, entries go straight to the spool, so a
# long partition does not pile up a task (and a wait for a connection) per request.
MAX_SLOW_WRITES = 32
# How old the in-memory copy of a model's price versions may get (see `_price_at`).
PRICE_CACHE_S = 30.0


def _iso(value: datetime) -> str:
    return value.isoformat()


class DatabaseLedger:
    """`LedgerWriter`: exactly one entry per request id, durable even with the database down."""

    def __init__(
        self,
        database: Database,
        spool: LedgerSpool,
        device_price: DevicePrice,
        *,
        write_timeout_s: float = LIVE_WRITE_TIMEOUT_S,
    ) -> None:
        self.database = database
        self.spool = spool
        self.device_price = device_price
        self.write_timeout_s = write_timeout_s
        self._spooling = False
        self._slow_writes: set[asyncio.Future[None]] = set()
        self._commits = GroupCommit(self._flush)
        self._model_ids: dict[str, str] = {}
        self._price_versions: dict[str, tuple[float, list[PriceVersion]]] = {}

    async def record(self, ctx: RequestContext, outcome: Outcome) -> None:
        try:
            await self._write_within_timeout(ctx, outcome)
            if self._spooling:
                self._spooling = False
                log.info("ledger database reachable again")
        except UNAVAILABLE as exc:
            if not self._spooling:
                self._spooling = True
                log.warning(
                    "ledger database unreachable: spooling entries",
                    extra={"error": type(exc).__name__},
                )
            await asyncio.to_thread(self.spool.append, self._spool_entry(ctx, outcome))

    async def _flush(self, raws: list[dict[str, Any]]) -> None:
        """One transaction for a group of entries (see group_commit.py).

        If the database refuses the group's rows (a constraint, not an outage), each
        entry is retried alone so one bad entry cannot take its neighbours down with
        it; the ones refused alone are kept in the rejected file, never dropped.
        """
        try:
            await self._insert(raws)
        except REFUSED:
            for raw in raws:
                try:
                    await self._insert([raw])
                except REFUSED as exc:
                    await asyncio.to_thread(self._reject, raw, exc)

    async def _insert(self, raws: list[dict[str, Any]]) -> None:
        async with self.database.session() as session:
            entries = [await self.price_entry(session, raw) for raw in raws]
            await repository.insert_if_absent(session, entries)

    @property
    def rejected_path(self) -> Path:
        return self.spool.path.with_name(self.spool.path.name + ".rejected")

    def _reject(self, raw: dict[str, Any], exc: BaseException) -> None:
        """Keep an entry the database will never accept, durably, for a person to resolve."""
        line = json.dumps({"entry": raw, "error": type(exc).__name__}, sort_keys=True) + "\n"
        with open(self.rejected_path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        log.error(
            "ledger entry refused by the database; kept in the rejected file",
            extra={"request_id": raw.get("request_id"), "error": type(exc).__name__},
        )

    async def _write_within_timeout(self, ctx: RequestContext, outcome: Outcome) -> None:
        """The live write, or `TimeoutError` after `write_timeout_s` (the write goes on)."""
        if len(self._slow_writes) >= MAX_SLOW_WRITES:
            raise TimeoutError("too many ledger writes are waiting on the database")
        future = self._commits.submit(self._spool_entry(ctx, outcome))
        done, _ = await asyncio.wait({future}, timeout=self.write_timeout_s)
        if not done:
            self._slow_writes.add(future)
            future.add_done_callback(self._slow_writes.discard)
            raise TimeoutError(f"the ledger write took over {self.write_timeout_s:g} s")
        future.result()

    def _spool_entry(self, ctx: RequestContext, outcome: Outcome) -> dict[str, Any]:
        """What replay needs to build the entry later (pricing happens at replay)."""
        u = outcome.usage
        return {
            "request_id": ctx.request_id,
            "tenant_id": ctx.tenant_id,
            "api_key_id": ctx.api_key_id,
            "model": ctx.model,
            "status": outcome.status,
            "input_tokens": u.prompt_tokens,
            "cached_tokens": u.cached_tokens,
            "output_tokens": u.completion_tokens,
            "device_ns": u.device_ns,
            "started_at": _iso(ctx.started_at),
            "finished_at": _iso(outcome.finished_at),
        }

    async def _model_id(self, session: Any, name: str) -> str:
        """The model's row id; a missing row is created and committed on its own first, so the
        cached id never points at a row that a rolled-back batch took with it."""
        model_id = self._model_ids.get(name)
        if model_id is None:
            async with self.database.session() as own:
                model_id = await repository.ensure_model(own, name)
            self._model_ids[name] = model_id
        return model_id

    async def _price_at(self, session: Any, model_id: str, moment: datetime) -> PriceVersion | None:
        """The version in force at `moment`, from a copy of the model's versions (30 s old at most).

        A version is never edited and new ones cannot be backdated (prices service),
        so the copy prices like a query, without a round trip; the one difference is
        that a version made to start at once applies here up to `PRICE_CACHE_S` late.
        """
        now = time.monotonic()
        cached = self._price_versions.get(model_id)
        if cached is None or now - cached[0] > PRICE_CACHE_S:
            cached = (now, await repository.price_versions(session, model_id))
            self._price_versions[model_id] = cached
        versions = cached[1]
        in_force = [v for v in versions if v.effective_from <= moment]
        return in_force[-1] if in_force else None

    async def price_entry(self, session: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Turn a raw entry (live or spooled) into a ledger row, priced when it started."""
        started_at = datetime.fromisoformat(raw["started_at"])
        model_id = await self._model_id(session, raw["model"])
        price_row = await self._price_at(session, model_id, started_at)
        usage = TokenUsage(
            input_tokens=int(raw["input_tokens"]),
            output_tokens=int(raw["output_tokens"]),
            cached_input_tokens=int(raw["cached_tokens"]),
        )
        charged = Decimal(0)
        if price_row is not None:
            charged = charge_for(
                usage,
                Price(
                    input_per_million=price_row.input_per_mtok,
                    output_per_million=price_row.output_per_mtok,
                    cached_input_per_million=price_row.cached_input_per_mtok,
                ),
            )
        seconds = seconds_from_ns(int(raw["device_ns"]))
        return {
            "request_id": raw["request_id"],
            "tenant_id": raw["tenant_id"],
            "api_key_id": raw["api_key_id"],
            "model_id": model_id,
            "price_id": price_row.id if price_row is not None else None,
            "status": raw["status"],
            "input_tokens": usage.input_tokens,
            "cached_tokens": usage.cached_input_tokens,
            "output_tokens": usage.output_tokens,
            "charged": charged,
            "device_seconds": seconds,
            "device_cost": device_cost(seconds, self.device_price),
            "started_at": started_at,
            "finished_at": datetime.fromisoformat(raw["finished_at"]),
        }

    async def replay_spool(self) -> int:
        """Move spooled entries into the database (idempotent); returns how many were sent."""

        async def sink(raw: dict[str, Any]) -> None:
            try:
                await self._insert([raw])
            except REFUSED as exc:  # would block every entry behind it: set aside, go on
                await asyncio.to_thread(self._reject, raw, exc)

        result = await self.spool.replay(sink)
        if result.error is not None:
            log.warning(
                "spool replay stopped",
                extra={"error": type(result.error).__name__, "remaining": result.remaining},
            )
        return result.replayed
