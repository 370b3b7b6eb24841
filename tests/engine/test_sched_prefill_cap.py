"""The prefill cap: in a step that runs decodes, prompt chunks share at most
`max_prefill_tokens_while_decoding` tokens, so a long prefill cannot stall every running
stream's next token; without decodes the whole budget prefills; prefill never starves."""

from __future__ import annotations

import pytest
from tiny_models import SchedulerSim

from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.scheduler import ScheduledSeq, SchedulerOutput
from hydrant.engine.sequence import Request
from hydrant.engine.token_budget import prefill_cap

CAP = 32
CONFIG = {
    "max_num_seqs": 32,
    "max_num_batched_tokens": 256,
    "short_lane_tokens": 256,
    "long_lane_tokens": 128,
    "long_prompt_threshold": 100,
    "max_prefill_tokens_while_decoding": CAP,
}


def _is_decode(item: ScheduledSeq) -> bool:
    return bool(item.seq.output_token_ids) and item.num_new_tokens == 1


def _split(out: SchedulerOutput) -> tuple[int, int]:
    """(decode tokens, prefill tokens) of one step."""
    decodes = sum(1 for item in out.scheduled if _is_decode(item))
    return decodes, out.num_batched_tokens - decodes


def _step(sim: SchedulerSim) -> SchedulerOutput:
    out = sim.scheduler.schedule()
    sim.scheduler.on_step_done(out)
    for item in out.scheduled:
        if item.completes:
            seq = item.seq
            seq.output_token_ids.append(1)
            if len(seq.output_token_ids) >= seq.request.params.max_tokens:
                sim.scheduler.finish_seq(seq, "length")
    return out


def test_an_idle_engine_prefills_with_the_whole_budget() -> None:
    sim = SchedulerSim(**CONFIG)
    short = sim.submit("t", prompt=90, out=4)
    long = sim.submit("t", prompt=300, out=4)
    out = _step(sim)
    chunks = {item.seq.request.request_id: item.num_new_tokens for item in out.scheduled}
    assert chunks == {short.request_id: 90, long.request_id: 128}  # lanes only, no cap
    sim.drain()


def _prompt_left(request: Request) -> int:
    seq = request.seqs[0]
    return max(0, len(request.prompt_token_ids) - seq.num_computed_tokens)


def test_with_decodes_running_prefill_stays_under_the_cap_and_always_progresses() -> None:
    sim = SchedulerSim(**CONFIG)
    decoders = [sim.submit("t", prompt=20, out=60) for _ in range(4)]
    _step(sim)  # their prompts, alone: 80 tokens at once
    assert all(len(r.seqs[0].output_token_ids) == 1 for r in decoders)
    shorts = [sim.submit("t", prompt=70, out=2) for _ in range(3)]
    long = sim.submit("t", prompt=300, out=2)  # behind them in order, not in service
    steps = 0
    while any(_prompt_left(r) for r in (long, *shorts)):
        long_left = _prompt_left(long)
        out = _step(sim)
        steps += 1
        _, prefill = _split(out)
        stepped = {item.seq.request.request_id for item in out.scheduled if _is_decode(item)}
        assert {r.request_id for r in decoders} <= stepped  # every stream got its token
        assert 0 < prefill <= CAP  # capped, and never starved
        if long_left:  # the long lane keeps its half of the cap beside the short prompts
            assert long_left - _prompt_left(long) >= min(CAP // 2, long_left)
    # 300 + 3 * 70 = 510 prompt tokens at 32 a step: 16 steps, each as short as a small one
    assert steps == -(-510 // CAP)
    sim.drain()


def test_a_running_long_prefill_leaves_half_the_cap_to_short_prompts() -> None:
    """The long prompt is mid-prefill (running, so scheduled before any waiting prompt);
    short prompts arriving now still get half the cap at once, and it keeps the other half."""
    sim = SchedulerSim(**CONFIG)
    # three streams decode beside the three prompts: the cap stays at its base (it grows
    # only while more requests wait than decode)
    decoders = [sim.submit("t", prompt=20, out=60) for _ in range(3)]
    _step(sim)
    long = sim.submit("t", prompt=400, out=2)
    _step(sim)
    assert 0 < _prompt_left(long) < 400  # running, chunked
    shorts = [sim.submit("t", prompt=40, out=2) for _ in range(2)]
    for _ in range(5):
        long_left, shorts_left = _prompt_left(long), sum(_prompt_left(r) for r in shorts)
        out = _step(sim)
        assert 0 < _split(out)[1] <= CAP
        assert long_left - _prompt_left(long) >= min(CAP // 2, long_left)
        short_done = shorts_left - sum(_prompt_left(r) for r in shorts)
        assert short_done >= min(CAP // 2, shorts_left)
    assert all(_prompt_left(r) == 0 for r in shorts)  # 80 tokens at 16 a step
    assert all(len(r.seqs[0].output_token_ids) >= 7 for r in decoders)  # never stalled
    sim.drain()


def test_the_cap_grows_while_more_requests_wait_than_decode() -> None:
    """The head of a burst: two streams decode, eight prompts wait. A chunk then stalls two
    streams to start many, so the cap is the base times eight over two (128); as the
    prompts start decoding the ratio falls and the cap comes back to the base."""
    sim = SchedulerSim(**CONFIG)
    decoders = [sim.submit("t", prompt=20, out=60) for _ in range(2)]
    _step(sim)
    burst = [sim.submit("t", prompt=70, out=40) for _ in range(8)]
    out = _step(sim)
    decodes, prefill = _split(out)
    assert decodes == 2 and prefill == CAP * 8 // 2  # 128: one prompt and most of another
    caps = []
    while any(_prompt_left(r) for r in burst):
        decoding = sum(
            1 for r in (*decoders, *burst) if r.seqs[0].output_token_ids and not _prompt_left(r)
        )
        waiting = sum(1 for r in burst if _prompt_left(r))
        out = _step(sim)
        decodes, prefill = _split(out)
        assert decodes == decoding  # every stream got its token
        expected = CAP if waiting <= decoding else min(256, CAP * waiting // decoding)
        assert 0 < prefill <= expected
        caps.append(expected)
    assert caps[-1] == CAP and max(caps) > CAP  # it grew at the head, back at the base after
    sim.drain()


def test_the_cap_by_the_queue() -> None:
    assert prefill_cap(512, decoding=4, waiting=4, total=8192) == 512  # as many wait: base
    assert prefill_cap(512, decoding=4, waiting=2, total=8192) == 512
    assert prefill_cap(512, decoding=4, waiting=12, total=8192) == 1536  # three times
    assert prefill_cap(512, decoding=2, waiting=199, total=8192) == 8192  # the whole budget
    assert prefill_cap(512, decoding=3, waiting=4, total=8192) == 682  # rounds down
    assert prefill_cap(512, decoding=0, waiting=50, total=8192) == 512  # no decodes: moot
    assert prefill_cap(None, decoding=1, waiting=50, total=8192) is None  # no cap stays none


def test_without_a_cap_a_step_takes_the_whole_lane_beside_decodes() -> None:
    sim = SchedulerSim(**{**CONFIG, "max_prefill_tokens_while_decoding": None})  # type: ignore[dict-item]
    [sim.submit("t", prompt=20, out=8) for _ in range(2)]
    _step(sim)
    sim.submit("t", prompt=300, out=2)
    _, prefill = _split(_step(sim))
    assert prefill == 128
    sim.drain()


def test_the_cap_must_be_positive() -> None:
    with pytest.raises(EngineConfigError):
        EngineConfig(max_prefill_tokens_while_decoding=0)


def test_the_setting_reaches_the_servers_with_zero_as_off() -> None:
    from hydrant.settings import load_settings

    assert load_settings({}).max_prefill_tokens_while_decoding == 1024
    env = {"HYDRANT_MAX_PREFILL_TOKENS_WHILE_DECODING": "0"}
    assert load_settings(env).max_prefill_tokens_while_decoding == 0


def test_the_background_cap_must_be_positive_and_its_setting_has_zero_as_off() -> None:
    from hydrant.settings import load_settings

    with pytest.raises(EngineConfigError):
        EngineConfig(max_background_step_tokens=0)
    assert load_settings({}).max_background_step_tokens is None  # by device
    env = {"HYDRANT_MAX_BACKGROUND_STEP_TOKENS": "0"}
    assert load_settings(env).max_background_step_tokens == 0
