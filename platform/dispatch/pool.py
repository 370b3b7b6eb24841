"""One model's pool of workers: routing, waking it from zero, idle scale-down, hot swap.

The pool's view of its workers comes from the registry (refreshed by the
manager's poll) plus what this gateway knows sooner: requests it has in
flight on each, a worker it could not reach (skipped until the registry
catches up), a wake that just succeeded. Requests that find no ready worker
wait on the pool, like Knative's activator: the first one starts a wake, the
others wait for the same wake (one wake, not N), all bounded by
`wake_timeout_s`, after which they get a 503 with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from hydrant.engine.protocol import EngineStats, GenerateChunk, GenerateRequest
from hydrant.engine.worker.wire import WorkerRecord, WorkerState
from hydrant.platform.dispatch.fair_share import FairQueue, Ticket
from hydrant.platform.dispatch.metrics import PoolMetrics, PoolSnapshot
from hydrant.platform.dispatch.routing import Candidate, choose
from hydrant.platform.dispatch.scale_down import idle_past, scale_down
from hydrant.platform.dispatch.scaler import PoolSpec, Scaler
from hydrant.platform.dispatch.worker_http import WorkerUnavailable
from hydrant.platform.errors import Conflict, ServiceUnavailable

log = logging.getLogger(__name__)

SCALE_OUT_INTERVAL_S = 30.0  # a new worker takes a while to come up: do not ask again at once
# How long a state this gateway set (a wake, a sleep) outranks older registry records: past
# it, the registry wins whatever it says (a worker that never heartbeats again, say).
TOLD_STATE_S = 30.0


class MemberHttp(Protocol):
    """How a pool talks to its members: `WorkerHttp` (Hydrant workers) or `UpstreamHttp`
    (OpenAI-compatible servers); dispatch is the same code for both.

    `sleep_path` and `wake_path`: the control calls of sleep mode (a worker's `/sleep` and
    `/wake`, vLLM's `/sleep?level=1` and `/wake_up`)."""

    sleep_path: str
    wake_path: str

    def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]: ...

    async def call(
        self, address: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
    ) -> Any: ...

    async def abort(self, address: str, request_id: str) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class PoolOptions:
    start_workers: int = 1
    max_workers: int = 4
    idle_timeout_s: float = 300.0
    scale_down: str = "sleep"  # or "exit"
    wake_timeout_s: float = 60.0
    swap_timeout_s: float = 300.0
    prefix_blocks: int = 8


@dataclass
class WorkerSlot:
    record: WorkerRecord
    inflight: int = 0
    inflight_tokens: int = 0
    down_until: float = 0.0  # monotonic: unreachable, skipped until then
    down_since: float = 0.0  # wall clock (heartbeats are wall-clock stamped)
    partitioned: bool = False  # down because its link went silent: a heartbeat is no cure
    retired: bool = False  # this gateway stopped routing to it (swap, scale-down)
    # A state this gateway put it in (wake, sleep): (state, the worker's `state_since` before
    # the change, monotonic time of the change). See `WorkerPool._after_told`.
    told: tuple[WorkerState, float, float] | None = None

    @property
    def worker_id(self) -> str:
        return self.record.worker_id

    def candidate(self) -> Candidate:
        stats = self.record.stats
        return Candidate(
            worker_id=self.worker_id,
            capacity=max(1, self.record.capacity),
            inflight=self.inflight,
            reported_running=stats.num_running if stats else 0,
            reported_waiting=stats.num_waiting if stats else 0,
            kv_usage=stats.kv_usage if stats else 0.0,
            adapters=frozenset(stats.loaded_adapters) if stats else frozenset(),
        )


def _seen_since(slot: WorkerSlot) -> float:
    """What a record predating a state change we are about to make carries (`_tell`).

    A worker stamps `state_since` itself when its state changes. An upstream
    member's record is written by health checks, stamped when a probe saw the
    change, which may be after we read the record: a probe that saw the member
    asleep just before our wake would pass for news. Any stamp from before the
    change (this gateway's wall clock; the probes run in gateways too) is stale.
    """
    return slot.record.state_since if slot.record.kind == "hydrant" else time.time()


@dataclass
class WorkerPool:
    spec: PoolSpec
    http: MemberHttp
    scaler: Scaler
    metrics: PoolMetrics
    options: PoolOptions = field(default_factory=PoolOptions)
    # `openai`: upstream servers, started and swapped by their own deployment, registered by
    # this gateway's health checks (dispatch.upstream_health); never woken, slept or swapped.
    kind: Literal["hydrant", "openai"] = "hydrant"
    clock: Callable[[], float] = time.monotonic
    # Upstream pools: bounded in-flight tokens per member, the rest waits in tenant-fair order.
    fair: FairQueue | None = None
    workers: dict[str, WorkerSlot] = field(default_factory=dict)
    waiting: int = 0
    pinned: tuple[str, str | None] | None = None  # after a swap: only this revision serves
    swapping: bool = False
    synced: bool = False  # the registry has been read at least once

    def __post_init__(self) -> None:
        self._changed = asyncio.Event()
        self._wake: asyncio.Task[None] | None = None
        self._wake_started: float | None = None
        self.last_used = self.clock()
        self._scaled_down_at: float | None = None
        self._sleep_refused_until = 0.0  # a worker refused to sleep: the idle loop waits
        self._scaled_out_at: float | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.metrics.wakes.labels(self.model)  # exported as 0 before the first wake
        self.metrics.wake_seconds.labels(self.model)

    @property
    def model(self) -> str:
        return self.spec.model

    # ---- the registry's view --------------------------------------------------------------

    def update(self, records: list[WorkerRecord]) -> None:
        """Replace the pool's workers by the registry's, keeping this gateway's own counts."""
        now = self.clock()
        fresh: dict[str, WorkerSlot] = {}
        for record in records:
            slot = self.workers.get(record.worker_id)
            if slot is None:
                slot = WorkerSlot(record)
            else:
                if (
                    slot.down_until > now
                    and not slot.partitioned
                    and record.heartbeat_at > slot.down_since
                ):
                    slot.down_until = 0.0  # it heartbeated after we failed to reach it: alive
                slot.record = self._after_told(slot, record, now)
            fresh[record.worker_id] = slot
        self.workers = fresh
        self.synced = True
        if any(s.inflight and s.record.state == "sleeping" for s in fresh.values()):
            # Asleep under our requests: another gateway put it to sleep (its idle check and
            # our dispatch crossed). A sleeping vLLM holds them until a wake: wake it now.
            self._start_wake()
        self._notify()

    @staticmethod
    def _after_told(slot: WorkerSlot, record: WorkerRecord, now: float) -> WorkerRecord:
        """The registry's record, unless it predates a state change this gateway made.

        A wake's answer comes before the worker's heartbeat says "ready" (that
        beat is a task of its own), and a registry read begun before the wake can
        land after it: taken as is, such a stale "sleeping" record sent every
        waiting request into a second wake (seen in CI: two wakes for one burst),
        and a stale "ready" after a sleep routed requests to a sleeping worker.
        Stale means the worker's last state change is the one we saw before ours
        (`state_since`, the worker's own clock on both sides: no clock skew).
        """
        if slot.told is None:
            return record
        state, seen_since, told_at = slot.told
        if record.state == state or record.state_since > seen_since or now - told_at > TOLD_STATE_S:
            slot.told = None  # the worker's own word has caught up, or has news of its own
            return record
        return msgspec.structs.replace(record, state=state)

    def _tell(self, slot: WorkerSlot, state: WorkerState, seen_since: float) -> None:
        """Record a state change this gateway just made; `seen_since`: the worker's
        `state_since` before the call (what a stale record still carries)."""
        slot.told = (state, seen_since, self.clock())
        slot.record = msgspec.structs.replace(slot.record, state=state)

    def _notify(self) -> None:
        if self._wake_started is not None and self.ready():
            self.metrics.wake_seconds.labels(self.model).observe(self.clock() - self._wake_started)
            self._wake_started = None
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _changed_or(self, timeout_s: float) -> None:
        """Until the pool changes (`_notify`), or `timeout_s` passed.

        Not `asyncio.wait_for`: on Python 3.11 it returns normally, and the cancellation is
        lost, when the event is set in the loop step the waiting task is cancelled in. Each
        notify wakes every waiter, and a request that leaves the fair queue notifies: so when
        many clients left at once (their requests cancelled together), most of them stayed
        queued and ran upstream to their end, for nobody."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._changed.wait()

    def _eligible(self, slot: WorkerSlot, now: float) -> bool:
        if slot.record.state != "ready" or slot.retired or slot.down_until > now:
            return False
        return self.pinned is None or slot.record.revision == self.pinned

    def ready(self) -> list[WorkerSlot]:
        now = self.clock()
        return [s for s in self.workers.values() if self._eligible(s, now)]

    def asleep(self) -> list[WorkerSlot]:
        """The members in sleep mode: what a wake wakes."""
        return [s for s in self.workers.values() if s.record.state == "sleeping"]

    def snapshot(self) -> PoolSnapshot:
        replicas: dict[str, int] = {}
        for slot in self.workers.values():
            state = (
                "draining" if slot.retired and slot.record.state == "ready" else slot.record.state
            )
            replicas[state] = replicas.get(state, 0) + 1
        return PoolSnapshot(
            model=self.model,
            replicas=replicas,
            waiting=self.waiting,
            inflight=sum(s.inflight for s in self.workers.values()),
            inflight_tokens=sum(s.inflight_tokens for s in self.workers.values()),
        )

    def stats(self) -> EngineStats:
        """The pool's workers' last reported stats, summed (KV usage: the mean)."""
        reported = [s.record.stats for s in self.workers.values() if s.record.stats is not None]
        total = sum(s.num_total_blocks for s in reported)
        free = sum(s.num_free_blocks for s in reported)
        return EngineStats(
            num_running=sum(s.num_running for s in reported),
            num_waiting=sum(s.num_waiting for s in reported) + self.waiting,
            kv_usage=(1 - free / total) if total else 0.0,
            num_free_blocks=free,
            num_total_blocks=total,
            prefix_cache_hit_rate=(
                sum(s.prefix_cache_hit_rate for s in reported) / len(reported) if reported else 0.0
            ),
            loaded_adapters=tuple(sorted({a for s in reported for a in s.loaded_adapters})),
        )

    # ---- taking a worker ------------------------------------------------------------------

    async def acquire(
        self,
        key: bytes | None,
        exclude: set[str],
        tokens: int,
        adapter: str | None = None,
        ticket: Ticket | None = None,
    ) -> WorkerSlot:
        """A ready worker for one request (counted in flight), waking the pool if need be;
        `adapter`: prefer a worker that has this LoRA adapter loaded (routing.choose);
        `ticket`: the request's place in the fair queue (`fair` pools only)."""
        self.last_used = self.clock()
        if self.fair is not None and ticket is not None:
            return await self._acquire_fair(self.fair, ticket, key, exclude, tokens)
        deadline = self.last_used + self.options.wake_timeout_s
        counted = False
        try:
            while True:
                candidates = [s for s in self.ready() if s.worker_id not in exclude]
                picked = choose([s.candidate() for s in candidates], key, adapter=adapter)
                if picked is not None:
                    if picked.full:  # everyone is full: it queues there, and we add a worker
                        self._scale_out()
                    slot = self.workers[picked.worker_id]
                    slot.inflight += 1
                    slot.inflight_tokens += tokens
                    return slot
                if not counted:
                    self.waiting += 1
                    counted = True
                if self.synced:  # before the first registry read, "no worker" means "not read yet"
                    self._start_wake()
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise ServiceUnavailable(
                        f"the model `{self.model}` is starting (its pool was scaled to zero)"
                        " and not ready yet; retry shortly",
                        code="model_not_ready",
                        retry_after=max(1.0, min(30.0, self.options.wake_timeout_s / 2)),
                    )
                await self._changed_or(min(remaining, 1.0))
        finally:
            if counted:
                self.waiting -= 1

    async def _acquire_fair(
        self, fair: FairQueue, ticket: Ticket, key: bytes | None, exclude: set[str], tokens: int
    ) -> WorkerSlot:
        """A member with room for `tokens` more, when the fair queue says it is this
        request's turn; refused (503) after the queue's timeout."""
        deadline = self.clock() + fair.timeout_s
        self.waiting += 1
        try:
            while True:
                awake = self.ready()
                ready = [s for s in awake if s.worker_id not in exclude]
                if not awake and self.synced and self._wakes():
                    # Members asleep, or none (a workload at zero) where this gateway wakes
                    # or scales them: the first waiter wakes them, and a wake may take
                    # longer than the queue's own patience.
                    self._start_wake()
                    deadline = max(deadline, self.last_used + self.options.wake_timeout_s)
                if fair.is_next(ticket):
                    room = [s for s in ready if fair.fits(s.inflight, s.inflight_tokens, tokens)]
                    picked = choose([s.candidate() for s in room], key)
                    if picked is not None:
                        slot = self.workers[picked.worker_id]
                        slot.inflight += 1
                        slot.inflight_tokens += tokens
                        fair.admit(ticket)
                        self._notify()  # the next in line may fit on another member
                        return slot
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise ServiceUnavailable(
                        f"the servers of `{self.model}` are saturated: the request waited"
                        f" {fair.timeout_s:g} s for room and was dropped; retry later"
                        if ready
                        else f"no server of `{self.model}` is ready; retry shortly",
                        code="pool_saturated" if ready else "no_worker",
                        retry_after=max(1.0, min(30.0, fair.timeout_s / 2)),
                    )
                await self._changed_or(min(remaining, 1.0))
        finally:
            self.waiting -= 1
            if not ticket.admitted:
                fair.abandon(ticket)
                self._notify()  # it may have been the head: the next one goes

    def release(self, slot: WorkerSlot, tokens: int, ticket: Ticket | None = None) -> None:
        slot.inflight = max(0, slot.inflight - 1)
        slot.inflight_tokens = max(0, slot.inflight_tokens - tokens)
        self.last_used = self.clock()
        if self.fair is not None and ticket is not None:
            self.fair.finished(ticket)
            self._notify()  # room freed: the fair queue's next request goes

    def mark_unreachable(
        self, slot: WorkerSlot, seconds: float = 10.0, *, partitioned: bool = False
    ) -> None:
        """Skip a worker we could not reach until the registry forgets it or it recovers.

        A refused or reset connection with heartbeats still coming is usually a
        worker that restarted its server: its next heartbeat ends the skip. A
        stream gone silent is a partition between this gateway and the worker,
        which heartbeats to Redis just fine: then only time ends the skip, or
        every request sent there meanwhile would wait out the idle timeout.
        """
        slot.down_until = self.clock() + seconds
        slot.down_since = time.time()
        slot.partitioned = partitioned

    def _scale_out(self) -> None:
        """One more worker when all are full, up to `max_workers`, at most once per interval."""
        alive = [
            s
            for s in self.workers.values()
            if s.record.state in ("starting", "ready") and not s.retired
        ]
        now = self.clock()
        if len(alive) >= self.options.max_workers or self.swapping:
            return
        if self._scaled_out_at is not None and now - self._scaled_out_at < SCALE_OUT_INTERVAL_S:
            return
        if any(s.record.state == "starting" for s in alive):
            return  # one is on its way already
        self._scaled_out_at = now
        log.info("pool full: adding a worker", extra={"model": self.model, "to": len(alive) + 1})
        task = asyncio.create_task(self.scaler.scale(self.spec, len(alive) + 1))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- wake from zero ---------------------------------------------------------------------

    def _wakes(self) -> bool:
        """Whether a request that finds no member wakes the pool: a pool that scales
        or sleeps (an upstream pool at a fixed size just has none up)."""
        return self.kind == "hydrant" or self.options.idle_timeout_s > 0 or bool(self.asleep())

    def _start_wake(self) -> None:
        if self._wake is not None and not self._wake.done():
            return
        self._wake = asyncio.create_task(self._wake_up(), name=f"wake-{self.model}")

    async def _wake_up(self) -> None:
        """One wake for every waiting request: wake sleeping workers, or start new ones."""
        if self._wake_started is None:
            self._wake_started = self.clock()
        self._scaled_down_at = None
        sleeping = self.asleep()
        alive = [
            s
            for s in self.workers.values()
            if s.record.state in ("starting", "ready") and not s.retired
        ]
        self.metrics.wakes.labels(self.model).inc()
        log.info(
            "waking pool",
            extra={"model": self.model, "sleeping": len(sleeping), "starting": len(alive)},
        )
        try:
            if sleeping:
                results = await asyncio.gather(
                    *(self._wake_worker(s) for s in sleeping), return_exceptions=True
                )
                if any(r is True for r in results):
                    return
            if not alive or all(s.down_until > self.clock() for s in alive):
                target = max(1, self.options.start_workers)
                await self.scaler.scale(self.spec, min(target, self.options.max_workers))
            # Then wait (bounded) for a worker to register ready; the waiters see it too.
            deadline = self.clock() + self.options.wake_timeout_s
            while not self.ready() and self.clock() < deadline:
                await self._changed_or(1.0)
        except Exception as exc:
            log.warning(
                "wake failed", extra={"model": self.model, "error": f"{type(exc).__name__}: {exc}"}
            )
            await asyncio.sleep(1.0)  # a failing scaler is not hammered by every waiter

    async def _wake_worker(self, slot: WorkerSlot) -> bool:
        seen_since = _seen_since(slot)
        try:
            await self.http.call(
                slot.record.address,
                "POST",
                self.http.wake_path,
                timeout_s=self.options.wake_timeout_s,
            )
        except WorkerUnavailable as exc:
            log.warning("worker did not wake", extra={"model": self.model, "error": exc.message})
            return False
        self._tell(slot, "ready", seen_since)
        self._notify()
        return True

    # ---- idle scale-down ------------------------------------------------------------------

    def idle_for(self) -> float:
        busy = self.waiting or any(s.inflight for s in self.workers.values())
        return 0.0 if busy else self.clock() - self.last_used

    async def maybe_scale_down(self) -> bool:
        """Scale to zero when idle past the timeout; True when it did."""
        timeout = self.options.idle_timeout_s
        if timeout <= 0 or self.swapping or (self._wake is not None and not self._wake.done()):
            return False
        if self.clock() < self._sleep_refused_until:
            return False
        ready = self.ready()
        # This gateway's idleness, then every gateway's (another one's requests keep a
        # worker busy): the second is the same check the reaper job makes.
        if not ready or self.idle_for() < timeout:
            return False
        if not idle_past([s.record for s in ready], timeout, time.time()):
            return False
        log.info(
            "pool idle: scaling to zero",
            extra={"model": self.model, "mode": self.options.scale_down},
        )
        await self._scale_down(ready, self.options.scale_down)
        return True

    async def sleep(self) -> None:
        """Put every ready worker to sleep now, idle or not (an admin's `POST /sleep`).
        Requests in flight finish first (a worker's sleep drains)."""
        if self.swapping:
            raise Conflict(f"a swap of `{self.model}` is running", code="swap_in_progress")
        ready = self.ready()
        if ready:
            await self._scale_down(ready, "sleep")

    async def wake(self) -> bool:
        """Wake the pool now (an admin's `POST /wake_up`) and wait, bounded by the wake
        timeout, until a worker serves; whether one does."""
        if not self.ready():
            self._start_wake()
            if self._wake is not None:
                await asyncio.shield(self._wake)
        return bool(self.ready())

    async def _scale_down(self, ready: list[WorkerSlot], mode: str) -> None:
        if mode != "sleep":
            for slot in ready:
                slot.retired = True
        seen_since = {s.worker_id: _seen_since(s) for s in ready}
        gone = await scale_down(self.spec, [s.record for s in ready], mode, self.http, self.scaler)
        if mode == "sleep":
            for slot in ready:
                if slot.worker_id in gone:
                    self._tell(slot, "sleeping", seen_since[slot.worker_id])
            if len(gone) < len(ready):  # refused (no sleep mode there?): not asked every second
                self._sleep_refused_until = self.clock() + SCALE_OUT_INTERVAL_S
        self._scaled_down_at = self.clock()
        self._notify()

    # ---- hot swap ---------------------------------------------------------------------------

    def check_swappable(self) -> None:
        if self.kind != "hydrant":
            raise Conflict(
                f"the pool of `{self.model}` is upstream servers ({self.kind}): roll them out"
                " with their own deployment; the gateway follows their health checks",
                code="upstream_pool",
            )

    async def swap(self, new: PoolSpec) -> int:
        """Start workers of `new`, wait until they serve, then drain the old ones; how many old."""
        self.check_swappable()
        if self.swapping:
            raise Conflict(f"a swap of `{self.model}` is already running", code="swap_in_progress")
        self.swapping = True
        try:
            serving = [s for s in self.ready() if s.record.revision != new.revision]
            replicas = max(1, min(len(serving), self.options.max_workers))
            if self.scaler.rolls_itself:
                await self.scaler.update(new)
            else:
                await self.scaler.scale(new, replicas)
            deadline = self.clock() + self.options.swap_timeout_s
            while len(self._ready_of(new)) < replicas:
                if self.clock() >= deadline:
                    raise ServiceUnavailable(
                        f"the new workers of `{self.model}` did not become ready in"
                        f" {self.options.swap_timeout_s:g} s; the old ones keep serving",
                        code="swap_timeout",
                    )
                await self._changed_or(1.0)
            old = [s for s in self.workers.values() if s.record.revision != new.revision]
            self.spec, self.pinned = new, new.revision
            for slot in old:
                slot.retired = True
            if not self.scaler.rolls_itself:
                await asyncio.gather(*(self.drain_worker(s) for s in old))
                await self.scaler.retire(new)
            self._notify()
            log.info("pool swapped", extra={"model": self.model, "drained": len(old)})
            return len(old)
        finally:
            self.swapping = False

    def _ready_of(self, spec: PoolSpec) -> list[WorkerSlot]:
        return [
            s
            for s in self.workers.values()
            if s.record.state == "ready" and s.record.revision == spec.revision and not s.retired
        ]

    async def drain_worker(self, slot: WorkerSlot) -> None:
        """Ask a worker to drain (no new requests, finish those in flight, exit)."""
        try:
            await self.http.call(slot.record.address, "POST", "/drain", timeout_s=10.0)
        except WorkerUnavailable as exc:  # already gone: nothing to drain
            log.info("old worker not drained", extra={"model": self.model, "error": exc.message})
