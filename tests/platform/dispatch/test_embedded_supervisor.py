"""The embedded default's supervisor: which dead engine child it restarts, when, and the
model state `/readyz` reads meanwhile.

The decisions only, over a fake scaler (what exited, what runs, what was started) and
the pool's worker records; the real child killed and restarted under a real `hydrant
serve`: tests/e2e/test_embedded_engine_process.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from hydrant.engine.worker.wire import WorkerRecord
from hydrant.platform.dispatch.embedded import EmbeddedSupervisor
from hydrant.platform.dispatch.pool import WorkerSlot
from hydrant.platform.dispatch.scaler import PoolSpec
from hydrant.platform.models.registry import ModelRegistry, ServedModel

SPEC = PoolSpec(model="demo", path="/models/demo")


@dataclass
class FakeScaler:
    died: list[Any] = field(default_factory=list)
    alive: int = 0
    started: int = 0

    def reap(self) -> list[Any]:
        return list(self.died)

    def running(self, spec: PoolSpec | None = None, model: str | None = None) -> list[Any]:
        """The running child, if any: its pid is 1000 + how many were started before it."""
        if not self.alive:
            return []
        return [SimpleNamespace(process=SimpleNamespace(pid=1000 + self.started))]

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        assert spec == SPEC and replicas == 1
        self.started += 1
        self.alive = 1

    def die(self, started_at: float) -> None:
        """The running child exits unasked, having started at `started_at`."""
        self.alive = 0
        process = SimpleNamespace(returncode=-9)
        self.died.append(SimpleNamespace(spec=SPEC, process=process, started_at=started_at))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slot(state: str, pid: int = 1000) -> WorkerSlot:
    """A worker record of the child with `pid` (the first one started: 1000)."""
    record = WorkerRecord(
        worker_id=f"w{pid}",
        model="demo",
        address="http://x",
        device="cpu",
        state=state,  # type: ignore[arg-type]
        path="/p",
        pid=pid,
    )
    return WorkerSlot(record)


def setup() -> tuple[EmbeddedSupervisor, FakeScaler, Clock, Any, ServedModel]:
    scaler = FakeScaler(alive=1)
    pool = SimpleNamespace(spec=SPEC, workers={})
    registry = ModelRegistry()
    served = ServedModel(
        name="demo", tokenizer=None, client=None, max_model_len=16, state="loading"
    )  # type: ignore[arg-type]
    registry.add(served)
    clock = Clock()
    manager = SimpleNamespace(pools={"demo": pool})
    supervisor = EmbeddedSupervisor(manager, registry, scaler, clock=clock)  # type: ignore[arg-type]
    return supervisor, scaler, clock, pool, served


async def test_loading_until_a_worker_is_ready_then_loaded() -> None:
    supervisor, scaler, _, pool, served = setup()
    await supervisor.check()
    assert served.state == "loading"
    pool.workers = {"w": slot("starting")}
    await supervisor.check()
    assert served.state == "loading"
    pool.workers = {"w": slot("ready")}
    await supervisor.check()
    assert served.state == "loaded"
    pool.workers = {"w": slot("sleeping")}  # asleep still serves: a request wakes it
    await supervisor.check()
    assert served.state == "loaded"
    assert scaler.started == 0


async def test_a_child_that_died_is_restarted_at_once_and_its_stale_record_ignored() -> None:
    supervisor, scaler, clock, pool, served = setup()
    pool.workers = {"w": slot("ready")}
    await supervisor.check()
    scaler.die(started_at=clock.now - 600)  # it had served a long while
    await supervisor.check()
    assert scaler.started == 1
    scaler.died.clear()
    # The new child has not registered yet; the dead one's record is still in the pool's
    # view: not taken for a ready worker.
    await supervisor.check()
    assert served.state == "loading"
    pool.workers = {"w1001": slot("ready", pid=1001)}
    await supervisor.check()
    assert served.state == "loaded"


async def test_a_child_that_keeps_dying_early_is_restarted_with_a_delay_and_failed() -> None:
    supervisor, scaler, clock, _, served = setup()
    scaler.die(started_at=clock.now - 1)
    await supervisor.check()
    scaler.died.clear()
    assert scaler.started == 1  # the first death: at once
    scaler.die(started_at=clock.now - 1)
    await supervisor.check()
    scaler.died.clear()
    assert scaler.started == 1  # the second early death: not at once
    assert served.state == "failed"
    clock.now += 1.0
    await supervisor.check()
    assert scaler.started == 2
    scaler.die(started_at=clock.now)
    await supervisor.check()
    scaler.died.clear()
    clock.now += 1.0
    await supervisor.check()
    assert scaler.started == 2  # the third: a longer delay
    clock.now += 1.0
    await supervisor.check()
    assert scaler.started == 3


async def test_a_pool_scaled_to_zero_by_the_gateway_is_not_restarted_and_stays_ready() -> None:
    supervisor, scaler, _, pool, served = setup()
    pool.workers = {"w": slot("ready")}
    await supervisor.check()
    scaler.alive = 0  # stopped by the pool (`exit` at idle): not among the dead
    pool.workers = {}
    await supervisor.check()
    assert scaler.started == 0
    assert served.state == "loaded"
