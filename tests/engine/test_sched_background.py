"""Background requests (batch lines) fill the steps foreground requests leave, and only those.

The real scheduler with a fake model (`SchedulerSim`): a background request never shares
a step with a running foreground one, resumes (blocks kept) as soon as none runs, gives
its blocks up first when a foreground request needs them, and a foreground request
waiting for blocks that background requests hold is admitted once they finish.
"""

from __future__ import annotations

from tiny_models import SchedulerSim

from hydrant.engine.protocol import BACKGROUND_PRIORITY
from hydrant.engine.sequence import Request, SequenceStatus


def _ids(sim: SchedulerSim, preempted: list[str] | None = None) -> set[str]:
    """One step; the request ids it computed (and those it preempted, into `preempted`)."""
    out = sim.scheduler.schedule()
    if preempted is not None:
        preempted.extend(s.request.tenant_id for s in out.preempted)
    sim.scheduler.on_step_done(out)
    for item in out.scheduled:
        if item.completes:
            seq = item.seq
            seq.output_token_ids.append(1)
            if len(seq.output_token_ids) >= seq.request.params.max_tokens:
                sim.scheduler.finish_seq(seq, "length")
    return {item.seq.request.request_id for item in out.scheduled}


def _finished(request: Request) -> bool:
    return request.seqs[0].status is SequenceStatus.FINISHED


def test_background_runs_only_in_steps_without_a_running_foreground_request() -> None:
    sim = SchedulerSim()
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=20, out=40) for _ in range(3)]
    for _ in range(3):
        assert _ids(sim) == {r.request_id for r in batch}  # idle engine: background runs
    kept = sim.bm.num_free_blocks
    urgent = sim.submit("a", prompt=20, out=5)
    first = _ids(sim)  # admitted beside the background decodes of this one step
    assert urgent.request_id in first
    while not _finished(urgent):
        assert _ids(sim) == {urgent.request_id}  # alone while it runs
    assert all(r.seqs[0].status is SequenceStatus.RUNNING for r in batch)  # paused, not evicted
    assert sim.bm.num_free_blocks <= kept
    assert _ids(sim) == {r.request_id for r in batch}  # and back at once
    sim.drain()


def test_a_new_background_request_waits_while_foreground_work_runs() -> None:
    sim = SchedulerSim()
    urgent = sim.submit("a", prompt=20, out=6)
    _ids(sim)
    late = sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=20, out=2)
    while not _finished(urgent):
        assert late.request_id not in _ids(sim)
    assert late.request_id in _ids(sim)
    sim.drain()


def test_a_running_foreground_request_takes_background_blocks_first() -> None:
    # 8 blocks of 16 tokens: the background requests hold 6; the foreground one grows to 4.
    sim = SchedulerSim(num_blocks=8, max_num_batched_tokens=256, short_lane_tokens=256)
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=32, out=64) for _ in range(3)]
    _ids(sim)
    urgent = sim.submit("a", prompt=16, out=48)
    preempted: list[str] = []
    while not _finished(urgent):
        _ids(sim, preempted)
    assert preempted and set(preempted) == {"b"}  # never the foreground request
    sim.drain()
    assert all(_finished(r) for r in batch)


def test_a_foreground_request_waiting_for_blocks_does_not_stall_the_engine() -> None:
    # 12 blocks: the background requests hold them all; the foreground one cannot start
    # until they finish, and does not pause them meanwhile (they would never free them).
    sim = SchedulerSim(num_blocks=12)
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=80, out=16) for _ in range(2)]
    _ids(sim)
    urgent = sim.submit("a", prompt=120, out=8)
    steps = 0
    while sim.scheduler.has_unfinished():
        assert _ids(sim), "a step computed nothing"
        steps += 1
        assert steps < 500
    assert _finished(urgent) and all(_finished(r) for r in batch)
    assert sim.bm.num_free_blocks == sim.bm.num_blocks
