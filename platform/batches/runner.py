"""Running a batch: each line through the interactive request path, stored exactly once.

A runner claims a batch's lease (one runner per batch; another takes over when it
lapses, i.e. when its runner died), reads the input file and runs every line not yet
stored, as many at once as the model's batch lane lets through (quotas/batch_lane.py),
each one through `serving.start_body` as a `/v1` request would go: same preparation,
admission, dispatch and rendering, at the lowest engine priority. A pool at zero is
woken by the first line, as by any request.

Exactly once: a line's result, its one ledger entry (at the batch price, keyed by the
line's request id) and its settlement of the batch's reservation (its share given back,
its charge counted: reservation.py) are written in one transaction, and only a stored
line counts or is skipped on resume; the quota store is then resynced to the row. A
line cut off mid-run (the gateway killed, the database away when it ended) stored,
billed and settled nothing; it runs again. Lines the engine could not take now (503,
429: a pool waking, a full lane) are retried, never failed; lines the endpoint refuses
(4xx) are stored as error lines.

Between lines the runner renews its lease and reads the batch's status: `cancelling`
stops new lines (running ones finish and are billed), the end of the window stops them
too; then finish.py writes the output and error files and settles the reservation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from sqlalchemy.exc import IntegrityError

from hydrant.platform.auth.principal import INFERENCE_SCOPE, Principal
from hydrant.platform.batches import repository
from hydrant.platform.batches.finish import Finisher
from hydrant.platform.batches.lines import ENDPOINTS, InputLine, line_cost, read_lines
from hydrant.platform.batches.output import LineSealer, answered, line_request_id, refused
from hydrant.platform.batches.reservation import HeldState
from hydrant.platform.billing.money import to_micro_units
from hydrant.platform.billing.pricing import Price
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.batch_models import Batch, BatchLine
from hydrant.platform.db.errors import DATABASE_UNAVAILABLE
from hydrant.platform.db.session import Database
from hydrant.platform.errors import DomainError, NotFound, RateLimited, ServiceUnavailable
from hydrant.platform.files.service import FileStore
from hydrant.platform.inference.deps import InferenceApi
from hydrant.platform.inference.serving import Endpoint, prepare_body, start_prepared
from hydrant.platform.ledger import repository as ledger_rows
from hydrant.platform.ledger.accounting import Metered, Outcome
from hydrant.platform.ledger.service import DatabaseLedger, raw_entry
from hydrant.platform.metrics.metered_ledger import MeteredLedger
from hydrant.platform.quotas.admission import BatchTicket
from hydrant.platform.quotas.policy import PlanPolicy, ProjectQuota

log = logging.getLogger(__name__)

LEASE = timedelta(seconds=20)  # a dead runner's batch is resumed this long after it died
RENEW_EVERY_S = 5.0
WATCH_EVERY_S = 1.0  # how soon a cancel (made on any gateway) stops the lines
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0
# A line failing with something unexpected (not a refusal, not a lack of capacity) is
# retried this often, then stored as an error line: a bug must not spin for a day.
MAX_UNEXPECTED_FAILURES = 3
_CAPACITY = (ServiceUnavailable, RateLimited)  # not now: retried, never a failed line


class _Captured:
    """The ledger a line's request writes to: it keeps the outcome for the runner, which
    writes the entry with the line's result (`InferenceService.start(ledger=…)`)."""

    def __init__(self) -> None:
        self.ctx: Metered | None = None
        self.outcome: Outcome | None = None

    async def record(self, ctx: Metered, outcome: Outcome) -> None:
        self.ctx, self.outcome = ctx, outcome


@dataclass(frozen=True)
class _Stored:
    """A line's result as it is stored. `prompt_tokens`: what it held of the batch's
    enqueued tokens; `share`: what it held of the batch's reservation (tokens, micro-units;
    nothing known for a line that could not be prepared: the batch's end gives it back)."""

    number: int
    request_id: str
    status: int
    result: bytes
    prompt_tokens: int = 0
    share: tuple[int, int] = (0, 0)


@dataclass
class _Stop:
    """Why a runner stops feeding lines (None: it has not)."""

    reason: str | None = None  # "cancelled", "expired", "lost" (another runner has it)


class BatchRunner:
    def __init__(
        self,
        database: Database,
        files: FileStore,
        api: InferenceApi,
        ledger: DatabaseLedger,
        finisher: Finisher,
        sealer: LineSealer,
        *,
        metered: MeteredLedger | None = None,
        quiet: Callable[[str], Awaitable[None]] | None = None,
        concurrency: int = 8,
        owner: str | None = None,
    ) -> None:
        self._database = database
        self._files = files
        self._api = api
        self._ledger = ledger
        self._finisher = finisher
        self._sealer = sealer
        self._metered = metered
        # Waits until a model has no interactive request in flight (the gate's `quiet`):
        # the runner's own CPU work (preparing lines, storing results) waits for the gaps.
        self._quiet = quiet
        self._concurrency = max(1, concurrency)
        self.owner = owner or f"{socket.gethostname()}:{secrets.token_hex(4)}"

    async def run(self, batch_id: str) -> str:
        """Work the batch until it is done (or stopped); what became of it.

        Each run holds the lease under an owner of its own, so a second run of the same
        batch, even in this process (a cancel enqueues one), waits its turn."""
        owner = f"{self.owner}:{secrets.token_hex(4)}"
        async with self._database.session() as session:
            claimed = await repository.claim(session, batch_id, owner, utcnow(), LEASE)
        if not claimed:
            return "not ours"  # finished, or another run holds it
        try:
            return await self._work(batch_id, owner)
        finally:
            with contextlib.suppress(Exception):  # at worst the lease lapses on its own
                async with self._database.session() as session:
                    await repository.release(session, batch_id, owner)

    async def _work(self, batch_id: str, owner: str) -> str:
        batch = await self._batch(batch_id)
        if batch.status == "validating":  # claimed only once its creation is long dead
            return await self._finisher.fail(
                batch, "creation_interrupted", "the batch's creation was cut short; create it again"
            )
        if batch.status == "cancelling":
            return await self._finisher.finish(batch, "cancelled")
        if batch.status == "finalizing":  # a finish cut short: all its lines ran
            return await self._finisher.finish(batch, "completed")
        if utcnow() >= batch.expires_at:
            return await self._finisher.finish(batch, "expired")
        # The store may have lost the reservation (a restart): the row's state is restored.
        await self._finisher.resync(batch.reservation, HeldState.of(batch))
        principal = await self._principal(batch)
        if principal is None:  # its tenant was suspended: no more of its work runs
            return await self._finisher.fail(
                batch, "tenant_suspended", "the batch's tenant is suspended"
            )
        try:
            content = await self._files.content(batch.tenant_id, batch.input_file_id)
        except NotFound:
            return await self._finisher.fail(batch, "input_file_deleted", "the input file is gone")
        endpoint = ENDPOINTS[batch.endpoint]
        async with self._database.session() as session:
            done = await repository.done_lines(session, batch.id)

        def still_to_run() -> list[InputLine]:
            return [
                line
                for line in read_lines(content, batch.endpoint, endpoint)
                if isinstance(line, InputLine) and line.number not in done
            ]

        pending = await asyncio.to_thread(still_to_run)  # a large file takes a while to read
        stop = _Stop()
        feeder = asyncio.create_task(self._feed(batch, principal, endpoint, pending, stop))
        watcher = asyncio.create_task(self._watch(batch, owner, stop))
        try:
            await asyncio.wait({feeder, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # A stop (cancel, the window's end, the lease lost) ends the lines still running:
            # they were not served, so they are neither stored nor billed.
            for task in (feeder, watcher):
                task.cancel()
            await asyncio.gather(feeder, watcher, return_exceptions=True)
        if feeder.done() and not feeder.cancelled() and feeder.exception() is not None:
            raise feeder.exception()  # type: ignore[misc]
        if stop.reason == "lost":
            return "lost"
        batch = await self._batch(batch_id)
        if stop.reason is None and batch.status == "cancelling":
            stop.reason = "cancelled"  # cancelled as its last lines finished
        return await self._finisher.finish(batch, stop.reason or "completed")

    async def _batch(self, batch_id: str) -> Batch:
        async with self._database.session() as session:
            batch = await session.get(Batch, batch_id)
        if batch is None:
            raise NotFound(f"no batch {batch_id}")
        return batch

    async def _principal(self, batch: Batch) -> Principal | None:
        """Who the lines run as: the batch's tenant under its plan now, with the key that
        made it and that key's project (for the ledger); None when the tenant is suspended.
        The project is attribution only here: its budgets and the key's were reserved when
        the batch was made (quotas/plan.py `batch_checks`), and the runner settles each
        line's share of that reservation, so a line must not reserve them again."""
        async with self._database.session() as session:
            found = await repository.tenant_and_plan(session, batch.tenant_id)
            project_id = await repository.key_project(session, batch.api_key_id)
        if found is None:
            raise NotFound(f"the tenant of {batch.id} is gone")
        tenant, plan = found
        if tenant.status != "active":
            return None
        policy = PlanPolicy.from_row(plan)
        return Principal(
            tenant_id=tenant.id,
            key_id=batch.api_key_id or "",
            key_prefix=batch.id,
            scopes=frozenset({INFERENCE_SCOPE}),
            plan_id=plan.id,
            weight=float(policy.fair_share_weight),
            allowed_models=policy.allowed_models,
            plan=policy,
            timezone=tenant.timezone,
            project=ProjectQuota(project_id) if project_id is not None else None,
        )

    async def _watch(self, batch: Batch, owner: str, stop: _Stop) -> None:
        """Renew the lease, and notice a cancel or the end of the window."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while stop.reason is None:
            await asyncio.sleep(WATCH_EVERY_S)
            held = True
            try:
                async with self._database.session() as session:
                    if loop.time() - renewed >= RENEW_EVERY_S:
                        held = await repository.claim(session, batch.id, owner, utcnow(), LEASE)
                        renewed = loop.time()
                    now = await repository.status_of(session, batch.id)
            except DATABASE_UNAVAILABLE:
                continue  # the lease has some seconds left; the next turn tries again
            if not held or now is None:
                stop.reason = "lost"
            elif now[0] == "cancelling":
                stop.reason = "cancelled"
            elif utcnow() >= now[1]:
                stop.reason = "expired"

    async def _feed(
        self,
        batch: Batch,
        principal: Principal,
        endpoint: Endpoint,
        pending: list[InputLine],
        stop: _Stop,
    ) -> None:
        """Run the pending lines, at most `concurrency` at once (they wait in the model's
        batch lane for their turn); stop starting new ones once `stop` says so."""
        running: set[asyncio.Task[None]] = set()
        places = asyncio.Semaphore(self._concurrency)

        def ended(task: asyncio.Task[None]) -> None:
            running.discard(task)
            places.release()

        try:
            for line in pending:
                await places.acquire()
                task = asyncio.create_task(self._line(batch, principal, endpoint, line, stop))
                running.add(task)
                task.add_done_callback(ended)
            if running:
                await asyncio.gather(*running)
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)

    async def _line(
        self, batch: Batch, principal: Principal, endpoint: Endpoint, line: InputLine, stop: _Stop
    ) -> None:
        """Run one line until it has a result, retrying what capacity refuses."""
        request_id = line_request_id(batch.id, line.number)
        delay = RETRY_FIRST_S
        unexpected = 0
        while True:
            try:
                await self._attempt(batch, principal, endpoint, line, request_id)
                return
            except _CAPACITY as exc:
                log.info(
                    "batch line waits for capacity",
                    extra={"batch_id": batch.id, "line": line.number, "code": exc.code},
                )
            except DATABASE_UNAVAILABLE as exc:
                log.warning(
                    "batch line could not be stored; it runs again",
                    extra={"batch_id": batch.id, "line": line.number, "error": type(exc).__name__},
                )
            except Exception:
                unexpected += 1
                log.exception(
                    "batch line failed", extra={"batch_id": batch.id, "line": line.number}
                )
                if unexpected >= MAX_UNEXPECTED_FAILURES:
                    result = refused(
                        line.custom_id,
                        request_id,
                        500,
                        "the request failed on the server",
                        "server_error",
                        "internal_error",
                        None,
                    )
                    await self._store(batch, _Stored(line.number, request_id, 500, result))
                    return
            if stop.reason is not None:
                return  # stopping anyway: the line stays unrun (and unbilled)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)

    async def _attempt(
        self,
        batch: Batch,
        principal: Principal,
        endpoint: Endpoint,
        line: InputLine,
        request_id: str,
    ) -> None:
        captured = _Captured()
        prompt_tokens, share = 0, (0, 0)
        try:
            await self._gap(batch.model)
            # Off the event loop (tokenizing, a chat template): the loop serves interactive
            # requests' tokens meanwhile.
            model, prepared = await asyncio.to_thread(
                prepare_body, self._api, principal, endpoint, line.body
            )
            cost = line_cost(prepared)
            prompt_tokens, share = cost.prompt_tokens, (cost.tokens, cost.micros(_price(batch)))
            generation = await start_prepared(
                self._api,
                principal,
                model,
                prepared,
                request_id,
                priority=0,
                batch=BatchTicket(batch.id),
                ledger=captured,
            )
            answer = await endpoint.whole(generation, model.tokenizer)
        except _CAPACITY:
            raise
        except DomainError as exc:  # the endpoint refuses this line: an error line
            result = refused(
                line.custom_id, request_id, exc.status, exc.message, exc.type, exc.code, exc.param
            )
            await self._store(
                batch,
                _Stored(line.number, request_id, exc.status, result, prompt_tokens, share),
            )
            return
        result = answered(line.custom_id, request_id, 200, answer)
        stored = _Stored(line.number, request_id, 200, result, prompt_tokens, share)
        await self._store(batch, stored, captured.ctx, captured.outcome)

    async def _store(
        self,
        batch: Batch,
        line: _Stored,
        ctx: Metered | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        """The line's result, its ledger entry and its counts: one transaction, once; then
        the quota store brought to the batch's reservation as that transaction left it."""
        await self._gap(batch.model)
        sealed = await asyncio.to_thread(
            self._sealer.seal, batch.tenant_id, batch.id, line.number, line.result
        )
        usage = outcome.usage if outcome is not None else None
        spent = 0
        try:
            async with self._database.session() as session:
                session.add(
                    BatchLine(
                        batch_id=batch.id,
                        line=line.number,
                        request_id=line.request_id,
                        status_code=line.status,
                        sealed=sealed,
                        finished_at=utcnow(),
                    )
                )
                await session.flush()  # a line stored already (a second runner) stops here
                if ctx is not None and outcome is not None:
                    raw = raw_entry(ctx, outcome, batch_id=batch.id)
                    raw["api_key_id"] = batch.api_key_id
                    entry = await self._ledger.price_entry(session, raw)
                    await ledger_rows.insert_if_absent(session, [entry])
                    spent = to_micro_units(Decimal(entry["charged"]))
                state = await repository.count_line(
                    session,
                    batch.id,
                    ok=200 <= line.status < 300,
                    prompt_tokens=line.prompt_tokens,
                    usage=(
                        (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens)
                        if usage is not None
                        else (0, 0, 0)
                    ),
                    share=line.share,
                    spent_micros=spent,
                )
        except IntegrityError:
            log.warning(
                "batch line stored twice: kept the first", extra={"request_id": line.request_id}
            )
            return
        await self._finisher.resync(batch.reservation, state)
        if self._metered is not None and ctx is not None and outcome is not None:
            self._metered.observe(ctx, outcome, price=_price(batch))

    async def _gap(self, model: str) -> None:
        if self._quiet is not None:
            await self._quiet(model)


def _price(batch: Batch) -> Price:
    """The batch price the batch reserved at: each line is settled at it."""
    return Price(
        input_per_million=Decimal(batch.price_input_per_mtok),
        output_per_million=Decimal(batch.price_output_per_mtok),
        cached_input_per_million=Decimal(batch.price_cached_input_per_mtok),
    )
