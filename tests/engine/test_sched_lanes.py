"""Length-tiered lanes: a long prefill never takes the short requests' budget."""

from __future__ import annotations

from tiny_models import SchedulerSim

from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.sequence import LONG_LANE, SHORT_LANE
from hydrant.engine.token_budget import TokenBudget

LANES = {
    "max_num_seqs": 32,
    "max_num_batched_tokens": 64,
    "short_lane_tokens": 64,
    "long_lane_tokens": 16,
    "long_prompt_threshold": 100,
}


def test_short_decodes_and_prefills_run_beside_a_long_prefill() -> None:
    sim = SchedulerSim(**LANES)
    shorts = [sim.submit("t", prompt=20, out=200) for _ in range(4)]
    for _ in range(3):
        sim.step()  # the short ones are decoding now
    long = sim.submit("t", prompt=400, out=4)
    newcomer_admitted = False
    for step in range(30):
        if step == 5:
            newcomer = sim.submit("t", prompt=30, out=4)
        out = sim.scheduler.schedule()
        sim.scheduler.on_step_done(out)
        chunks = {item.seq.request.request_id: item.num_new_tokens for item in out.scheduled}
        assert chunks.get(long.request_id, 0) <= 16  # the long lane's budget
        assert all(chunks.get(s.request_id) == 1 for s in shorts)  # every short decode ran
        if step == 5:
            # a short prompt arriving mid-prefill is prefilled at once, not after the long one
            assert chunks[newcomer.request_id] == 30
            newcomer_admitted = True
        for item in out.scheduled:
            if item.completes:
                item.seq.output_token_ids.append(1)
    assert newcomer_admitted
    assert long.seqs[0].num_computed_tokens >= 400  # it progressed: 16 tokens a step
    for seq in [s.seqs[0] for s in shorts] + [long.seqs[0], newcomer.seqs[0]]:
        sim.scheduler.finish_seq(seq, "abort")
    assert sim.bm.num_free_blocks == sim.bm.num_blocks


def test_short_flood_does_not_starve_the_long_lane() -> None:
    sim = SchedulerSim(**LANES)
    for _ in range(12):
        sim.submit("t", prompt=60, out=2)  # 720 tokens of short prefill demand
    long = sim.submit("t", prompt=300, out=2)
    out = sim.scheduler.schedule()
    chunks = {item.seq.request.request_id: item.num_new_tokens for item in out.scheduled}
    assert chunks[long.request_id] == 16
    assert out.num_batched_tokens == 64
    sim.scheduler.on_step_done(out)
    sim.drain()


def test_budget_reserves_the_long_lane_only_while_it_has_work() -> None:
    config = EngineConfig(**LANES)
    idle = TokenBudget(config, long_demand=0)
    assert idle.grant(SHORT_LANE, 100) == 64
    busy = TokenBudget(config, long_demand=1000)
    assert busy.grant(SHORT_LANE, 100) == 48
    assert busy.grant(LONG_LANE, 100) == 16
    assert busy.total_left == 0
