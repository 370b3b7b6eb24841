"""Write each request's one ledger entry: to the database, or to the spool when it is down.

The entry is priced here at the price version in force when the request
started, with the engine's measured device-seconds costed at the configured
device price, so reports can show revenue, cost and margin from one row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from sqlalchemy.exc import DataError, IntegrityError

from hydrant.platform.billing.device import DevicePrice, device_cost, seconds_from_ns
from hydrant.platform.billing.pricing import TokenUsage, adapter_model_name, charge_for
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import ServiceUnavailable
from hydrant.platform.ledger import repository
from hydrant.platform.ledger.accounting import Metered, Outcome
from hydrant.platform.ledger.append_placement import AppendPlacement
from hydrant.platform.ledger.group_commit import GroupCommit
from hydrant.platform.ledger.pinned import PinnedWriter
from hydrant.platform.ledger.repository import PriceVersion
from hydrant.platform.ledger.spool import LedgerSpool, SpoolFullError

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
# After a live write timed out, entries go straight to the spool (no request waits out
# the timeout again) until a ping answers; at most this often a new ping is sent.
# Why only after a timeout: a refused connection fails in milliseconds, so there the
# next live write is itself the cheap probe.
STALL_PROBE_S = 0.5
# How old the in-memory copy of a model's price versions may get (see `_price_at`).
PRICE_CACHE_S = 30.0
# While the database is down and the spool is full, new requests are refused; at most
# this often one of them checks whether the database is back (a cheap ping).
UNRECORDABLE_PROBE_S = 1.0

# Where a request's entry must be durable before its response completes:
# "database": committed in the ledger table (the request waits for PostgreSQL's commit);
# "journal": fsync'd in the local spool (one fsync for the entries that finish together),
#   then moved into the database in the background, in batches, insert-if-absent by
#   request id. Both keep one entry per 200 through a crash: the journal replays on restart.
LedgerCommit = Literal["database", "journal"]
# How long the journal's mover lets entries gather before one batch goes to the database,
# and the most entries one batch (one transaction) takes.
JOURNAL_GATHER_S = 0.25
JOURNAL_BATCH = 512
# After the database failed a batch, the mover waits this long before trying again.
JOURNAL_RETRY_S = 1.0


def _unrecordable() -> ServiceUnavailable:
    return ServiceUnavailable(
        "usage cannot be recorded right now (ledger database unreachable and its spool is"
        " full): the request is refused rather than served unmetered; retry later",
        code="ledger_unavailable",
        retry_after=5,
    )


def _iso(value: datetime) -> str:
    return value.isoformat()


def raw_entry(ctx: Metered, outcome: Outcome, batch_id: str | None = None) -> dict[str, Any]:
    """A request's entry as the spool keeps it and `price_entry` prices it (pricing happens
    when it is written, at the version in force when the request started). `batch_id`: a
    Batch API line, priced at the batch price (the batch runner writes those itself, in
    the transaction that stores the line's result)."""
    u = outcome.usage
    raw: dict[str, Any] = {
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
    if batch_id is not None:
        raw["batch_id"] = batch_id
    if ctx.adapter is not None:
        raw["adapter"] = ctx.adapter
    who = ctx.attribution
    if who is not None:  # only what is set: an entry without attribution spools as before
        if who.project_id is not None:
            raw["project_id"] = who.project_id
        if who.end_user is not None:
            raw["end_user"] = who.end_user
        if who.tags:
            raw["tags"] = dict(who.tags)
    return raw


class DatabaseLedger:
    """`LedgerWriter`: exactly one entry per request id, durable even with the database down."""

    def __init__(
        self,
        database: Database,
        spool: LedgerSpool,
        device_price: DevicePrice,
        *,
        write_timeout_s: float = LIVE_WRITE_TIMEOUT_S,
        commit: LedgerCommit = "database",
    ) -> None:
        if commit not in ("database", "journal"):
            raise ValueError(f"unknown ledger commit mode {commit!r}")
        self.commit: LedgerCommit = commit
        self.database = database
        self.spool = spool
        self.device_price = device_price
        self.write_timeout_s = write_timeout_s
        self._spooling = False
        self._stalled = False  # a live write timed out: spool until a ping answers
        self._stall_probed_at = 0.0
        self._stall_pings: set[asyncio.Future[None]] = set()
        self._spool_full = False  # an entry could be neither written nor spooled
        self._probed_at = 0.0
        self._slow_writes: set[asyncio.Future[None]] = set()
        self._commits = GroupCommit(self._flush)
        self._journal = GroupCommit(self._append_journal)  # group fsync (journal mode)
        # Inline while the disk is fast; late-bound, so the spool's method is looked up per call.
        self._journal_append = AppendPlacement(lambda raws: self.spool.append_many(raws))
        self._journal_waiting = asyncio.Event()  # entries in the journal for the mover
        self._replay_lock = asyncio.Lock()  # the mover and the outage replay take turns
        self._model_ids: dict[str, str] = {}
        self._price_versions: dict[str, tuple[float, list[PriceVersion]]] = {}
        self._pinned = PinnedWriter(database) if PinnedWriter.supports(database) else None

    async def record(self, ctx: Metered, outcome: Outcome) -> None:
        if self.commit == "journal":
            await self._record_in_journal(ctx, outcome)
            return
        if self._stalled:
            self._probe_stalled_database()
            await self._spool_append(ctx, outcome)
            return
        try:
            await self._write_within_timeout(ctx, outcome)
            self._spool_full = False
            if self._spooling:
                self._spooling = False
                log.info("ledger database reachable again")
        except UNAVAILABLE as exc:
            if isinstance(exc, TimeoutError) and not self._stalled:
                self._stalled = True
                self._stall_probed_at = time.monotonic()
            if not self._spooling:
                self._spooling = True
                log.warning(
                    "ledger database unreachable: spooling entries",
                    extra={"error": type(exc).__name__},
                )
            await self._spool_append(ctx, outcome)

    async def _spool_append(self, ctx: Metered, outcome: Outcome) -> None:
        try:
            await asyncio.to_thread(self.spool.append, self._spool_entry(ctx, outcome))
        except SpoolFullError as full:
            if not self._spool_full:
                log.error("ledger spool full with the database unreachable: refusing requests")
            self._spool_full = True
            raise _unrecordable() from full

    def _probe_stalled_database(self) -> None:
        """Send a ping (at most every `STALL_PROBE_S`) whose answer ends the stall.

        No request waits on it, and it has no timeout of its own: a ping that
        hangs with the database simply never answers, and a later one may. The
        pings in flight are bounded by the connection pool (its own timeout).
        """
        now = time.monotonic()
        if now - self._stall_probed_at < STALL_PROBE_S:
            return
        self._stall_probed_at = now
        ping = asyncio.ensure_future(self.database.ping())
        self._stall_pings.add(ping)
        ping.add_done_callback(self._stall_ping_done)

    def _stall_ping_done(self, ping: asyncio.Future[None]) -> None:
        self._stall_pings.discard(ping)
        if ping.cancelled() or ping.exception() is not None or not self._stalled:
            return
        self._stalled = False
        log.info("ledger database answering again: live writes resume")

    async def _record_in_journal(self, ctx: Metered, outcome: Outcome) -> None:
        """Journal mode: durable in the spool (group fsync) now, in the database soon."""
        try:
            await asyncio.shield(self._journal.submit(self._spool_entry(ctx, outcome)))
        except SpoolFullError as full:
            if not self._spool_full:
                log.error("ledger journal full (database behind or down): refusing requests")
            self._spool_full = True
            raise _unrecordable() from full

    async def _append_journal(self, raws: list[dict[str, Any]]) -> None:
        await self._journal_append(raws)
        self._journal_waiting.set()  # here, not in `record`: its caller may be gone

    async def move_journal(self) -> None:
        """Journal mode's background task: move journaled entries into the database.

        Runs for the gateway's life (cancelled at stop; the gateway's last replay
        then moves what is left). A failed batch stays in the journal and is retried;
        the database down for long fills the journal, and a full journal refuses work.
        """
        failing = False
        if self.spool.size_bytes:  # left by a previous run (a crash): moved first
            log.info(
                "ledger journal holds entries of a previous run: moving them",
                extra={"bytes": self.spool.size_bytes},
            )
            self._journal_waiting.set()
        while True:
            await self._journal_waiting.wait()
            await asyncio.sleep(JOURNAL_GATHER_S)  # let the entries of a busy moment gather
            self._journal_waiting.clear()
            try:
                async with self._replay_lock:
                    result = await self.spool.replay_batches(
                        self._flush, batch_size=JOURNAL_BATCH, count_remaining=False
                    )
                error: BaseException | None = result.error
            except Exception as exc:
                error = exc
            if error is None:
                self._spool_full = False
                if failing:
                    failing = False
                    log.info("ledger database reachable again: journal moving")
                continue
            if not failing:  # once per outage, not per retry
                failing = True
                log.warning(
                    "ledger journal cannot reach the database: entries wait in the journal",
                    extra={"error": type(error).__name__},
                )
            self._journal_waiting.set()
            await asyncio.sleep(JOURNAL_RETRY_S)

    async def ensure_recordable(self) -> None:
        """Refuse new work (503) while an entry could be neither written nor spooled.

        Why before the work: once the spool is full, a request served now could not
        be billed, and a 503 after generating would waste the device too. The state
        clears when a write succeeds or a (rate-limited) ping finds the database back.
        In journal mode it clears when the mover has made room in the journal.
        """
        if not self._spool_full:
            return
        if self.commit == "journal":
            if self.spool.size_bytes < self.spool.max_bytes // 2:
                self._spool_full = False
                return
            raise _unrecordable()
        now = time.monotonic()
        if now - self._probed_at >= UNRECORDABLE_PROBE_S:
            self._probed_at = now
            with contextlib.suppress(Exception):  # still down: refused below
                await asyncio.wait_for(self.database.ping(), self.write_timeout_s)
                self._spool_full = False
                log.info("ledger database reachable again: accepting requests")
                return
        raise _unrecordable()

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
        pinned = self._pinned
        if pinned is not None and pinned.available:  # PostgreSQL: one round trip, no session
            entries = [await self.price_entry(None, raw) for raw in raws]
            await pinned.insert(entries)
            return
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

    async def _write_within_timeout(self, ctx: Metered, outcome: Outcome) -> None:
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

    def _spool_entry(self, ctx: Metered, outcome: Outcome) -> dict[str, Any]:
        return raw_entry(ctx, outcome)

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
        `session` None (the pinned path): a refresh reads in a session of its own.
        """
        now = time.monotonic()
        cached = self._price_versions.get(model_id)
        if cached is None or now - cached[0] > PRICE_CACHE_S:
            if session is None:
                async with self.database.session() as own:
                    versions = await repository.price_versions(own, model_id)
            else:
                versions = await repository.price_versions(session, model_id)
            cached = (now, versions)
            self._price_versions[model_id] = cached
        versions = cached[1]
        in_force = [v for v in versions if v.effective_from <= moment]
        return in_force[-1] if in_force else None

    async def price_entry(self, session: Any, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Turn a raw entry (live or spooled) into a ledger row, priced when it started."""
        started_at = datetime.fromisoformat(raw["started_at"])
        model_id = await self._model_id(session, raw["model"])
        adapter = raw.get("adapter")  # a LoRA adapter: its own price version, if it has one
        price_row = None
        if adapter is not None:
            own_id = await self._model_id(session, adapter_model_name(raw["model"], adapter))
            price_row = await self._price_at(session, own_id, started_at)
        if price_row is None:
            price_row = await self._price_at(session, model_id, started_at)
        usage = TokenUsage(
            input_tokens=int(raw["input_tokens"]),
            output_tokens=int(raw["output_tokens"]),
            cached_input_tokens=int(raw["cached_tokens"]),
        )
        batch_id = raw.get("batch_id")  # a Batch API line: charged at the batch price
        charged = Decimal(0)
        if price_row is not None:
            charged = charge_for(usage, price_row.price(batch=batch_id is not None))
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
            "batch_id": batch_id,
            "adapter": adapter,
            "project_id": raw.get("project_id"),
            "end_user": raw.get("end_user"),
            "tags": raw.get("tags"),
        }

    async def replay_spool(self) -> int:
        """Move spooled entries into the database (idempotent); returns how many were sent."""

        async def sink(raw: dict[str, Any]) -> None:
            try:
                await self._insert([raw])
            except REFUSED as exc:  # would block every entry behind it: set aside, go on
                await asyncio.to_thread(self._reject, raw, exc)

        async with self._replay_lock:
            if self.commit == "journal":  # the whole journal, in batches (see move_journal)
                result = await self.spool.replay_batches(self._flush, batch_size=JOURNAL_BATCH)
            else:
                result = await self.spool.replay(sink)
        if result.error is not None:
            log.warning(
                "spool replay stopped",
                extra={"error": type(result.error).__name__, "remaining": result.remaining},
            )
        return result.replayed
