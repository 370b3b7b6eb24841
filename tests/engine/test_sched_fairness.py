"""Fair share across tenants, simulated on the real scheduler and block manager.

The model is faked (every sequence that completes a step gets token 1), which
is all the scheduler can see of it anyway; this keeps hundreds of steps cheap.
Service is what the scheduler grants: tokens computed per tenant per step.
"""

from __future__ import annotations

from collections import Counter

from tiny_models import SchedulerSim as Sim

from hydrant.engine.sequence import SequenceStatus


def _keep_flooded(sim: Sim, tenant: str, depth: int, weight: float = 1.0) -> None:
    while len(sim.unfinished(tenant)) < depth:
        sim.submit(tenant, weight)


def test_light_tenant_gets_its_fair_share_against_a_flood() -> None:
    sim = Sim()
    served: Counter[str] = Counter()
    backlogged_steps = 0
    for step in range(600):
        _keep_flooded(sim, "heavy", 40)
        if step % 2 == 0:  # a steady trickle, faster than its share: it stays backlogged
            sim.submit("light")
        got = sim.step()
        if step >= 100 and sim.waiting("light") > 0:
            served += got
            backlogged_steps += 1
    assert backlogged_steps > 400
    share = served["light"] / (served["light"] + served["heavy"])
    assert abs(share - 0.5) <= 0.05, f"light tenant share {share:.3f}, fair share 0.5"
    sim.drain()


def test_weights_two_to_one_split_service_two_to_one() -> None:
    sim = Sim()
    served: Counter[str] = Counter()
    for step in range(600):
        _keep_flooded(sim, "gold", 30, weight=2.0)
        _keep_flooded(sim, "basic", 30, weight=1.0)
        got = sim.step()
        if step >= 100:
            served += got
    share = served["gold"] / (served["gold"] + served["basic"])
    assert abs(share - 2 / 3) <= 2 / 3 * 0.1, f"gold share {share:.3f}, fair share 0.667"
    sim.drain()


def test_a_returning_idle_tenant_cannot_spend_banked_credit() -> None:
    sim = Sim()
    for _ in range(300):
        _keep_flooded(sim, "early", 40)
        sim.step()
    served: Counter[str] = Counter()
    for _ in range(150):
        _keep_flooded(sim, "early", 40)
        _keep_flooded(sim, "late", 40)
        served += sim.step()
    share = served["late"] / (served["late"] + served["early"])
    # without the lift "late" would have all of it until it caught up 300 steps of service
    assert share < 0.6, f"late tenant took {share:.3f} of the service"
    sim.drain()


def test_priority_is_compared_before_fair_share() -> None:
    sim = Sim(max_num_seqs=1)
    sim.submit("a", out=4)
    for _ in range(3):
        sim.step()  # tenant "a" has received service, so "b" is ahead on fairness
    low = sim.submit("b", priority=5, out=2)
    urgent = sim.submit("a", priority=-1, out=2)
    while urgent.seqs[0].status is not SequenceStatus.FINISHED:
        sim.step()
        assert low.seqs[0].status is SequenceStatus.WAITING
    sim.drain()


def test_preemption_picks_the_most_served_tenant_first() -> None:
    # 13 blocks of 16: four sequences of 32+32 tokens do not fit at once
    sim = Sim(num_blocks=13, max_num_seqs=4)
    heavy = [sim.submit("heavy") for _ in range(3)]
    light = sim.submit("light")  # active alongside: it gets a third of heavy's service
    preempted_tenants: list[str] = []
    while sim.scheduler.has_unfinished():
        out = sim.scheduler.schedule()
        preempted_tenants += [s.request.tenant_id for s in out.preempted]
        sim.scheduler.on_step_done(out)
        for item in out.scheduled:
            if item.completes:
                item.seq.output_token_ids.append(1)
                if len(item.seq.output_token_ids) >= 32:
                    sim.scheduler.finish_seq(item.seq, "length")
    assert preempted_tenants and set(preempted_tenants) == {"heavy"}
    assert all(r.finished for r in [*heavy, light])
    assert sim.bm.num_free_blocks == sim.bm.num_blocks
