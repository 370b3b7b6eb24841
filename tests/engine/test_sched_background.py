"""Background requests (batch lines) fill the steps foreground requests leave, and only those.

The real scheduler with a fake model (`SchedulerSim`): a background request never shares
a step with a running foreground one, resumes (blocks kept) as soon as none runs, gives
its blocks up first when a foreground request needs them, and a foreground request
waiting for blocks that background requests hold is admitted once they finish. A step of
background work alone holds at most `max_background_step_tokens` (issue #27), and a
foreground request that arrives starts in a step of its own.
"""

from __future__ import annotations

import pytest
from tiny_models import SchedulerSim

from hydrant.engine.protocol import BACKGROUND_PRIORITY
from hydrant.engine.scheduler import SchedulerOutput
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
    assert _ids(sim) == {urgent.request_id}  # it starts alone: the decodes wait this step
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
    # 8 blocks of 16 tokens: the background requests hold 6 (their prompts in one step, the
    # background cap as high as the budget); the foreground one grows to 4.
    sim = SchedulerSim(
        num_blocks=8,
        max_num_batched_tokens=256,
        short_lane_tokens=256,
        max_background_step_tokens=256,
    )
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


def _background_tokens(out: SchedulerOutput) -> int:
    return sum(i.num_new_tokens for i in out.scheduled if i.seq.request.priority > 0)


def _step(sim: SchedulerSim) -> SchedulerOutput:
    """One step, the fake model's token for each sequence that reached its end."""
    out = sim.scheduler.schedule()
    sim.scheduler.on_step_done(out)
    for item in out.scheduled:
        if item.completes:
            seq = item.seq
            seq.output_token_ids.append(1)
            if len(seq.output_token_ids) >= seq.request.params.max_tokens:
                sim.scheduler.finish_seq(seq, "length")
    return out


BATCH_CONFIG = {"max_num_seqs": 16, "max_num_batched_tokens": 512, "short_lane_tokens": 512}


@pytest.mark.parametrize("cap", [1, 24, 64])
def test_a_step_of_background_work_alone_holds_at_most_the_cap_and_uses_it_all(cap: int) -> None:
    # Eight lines at once, as the batch lane lets them in: 320 prompt tokens, which one
    # step would otherwise prefill together (the budget allows 512).
    sim = SchedulerSim(**BATCH_CONFIG, max_background_step_tokens=cap)
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=40, out=8) for _ in range(8)]
    steps = 0
    while sim.scheduler.has_unfinished():
        demand = sum(s.num_uncomputed for s in (*sim.scheduler.running, *sim.scheduler.waiting))
        out = _step(sim)
        steps += 1
        assert out.num_batched_tokens == min(cap, demand)  # capped, and never idle below it
        assert steps < 1000
    assert all(_finished(r) for r in batch)
    assert sim.bm.num_free_blocks == sim.bm.num_blocks


def test_without_the_cap_the_same_lines_prefill_in_one_step() -> None:
    """The other side of the test above: what the cap changes."""
    sim = SchedulerSim(**BATCH_CONFIG, max_background_step_tokens=10**6)
    for _ in range(8):
        sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=40, out=8)
    assert _step(sim).num_batched_tokens == 320
    sim.drain()


def test_the_cap_leaves_foreground_work_alone() -> None:
    sim = SchedulerSim(**BATCH_CONFIG, max_background_step_tokens=16)
    prompts = [sim.submit("a", prompt=40, out=2) for _ in range(4)]
    assert _step(sim).num_batched_tokens == 160  # 4 prompts at once, as before the cap
    assert all(len(r.seqs[0].output_token_ids) == 1 for r in prompts)
    sim.drain()


@pytest.mark.parametrize("arrive_after", [0, 1, 2, 5, 9])
def test_an_arriving_foreground_request_waits_on_no_background_token(arrive_after: int) -> None:
    """Whatever the background work is doing (prefilling in chunks, decoding), the next
    step runs the new foreground request alone, and so does every step until it ends."""
    cap = 24
    sim = SchedulerSim(**BATCH_CONFIG, max_background_step_tokens=cap)
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=40, out=32) for _ in range(8)]
    for _ in range(arrive_after):
        assert 0 < _background_tokens(_step(sim)) <= cap
    urgent = sim.submit("a", prompt=20, out=6)
    steps = 0
    while not _finished(urgent):
        out = _step(sim)
        steps += 1
        assert _background_tokens(out) == 0
        assert {i.seq.request.request_id for i in out.scheduled} == {urgent.request_id}
    assert steps == 6  # its prompt and a token a step: never held back either
    assert 0 < _background_tokens(_step(sim)) <= cap  # then the lines go on at once
    sim.drain()
    assert all(_finished(r) for r in batch)


def test_a_foreground_request_that_cannot_start_leaves_the_background_capped() -> None:
    # 12 blocks held by the background lines: the foreground request waits for blocks and
    # the lines go on (capped) until they free them; it then starts alone.
    sim = SchedulerSim(num_blocks=12, max_background_step_tokens=32)
    batch = [sim.submit("b", priority=BACKGROUND_PRIORITY, prompt=80, out=16) for _ in range(2)]
    _step(sim)
    urgent = sim.submit("a", prompt=120, out=4)
    while urgent.seqs[0].status is SequenceStatus.WAITING:
        out = _step(sim)
        assert out.num_batched_tokens > 0
        assert _background_tokens(out) <= 32
    sim.drain()
    assert _finished(urgent) and all(_finished(r) for r in batch)
