"""The engine's request API: bad input, abort, stop rules, n > 1, metering, metrics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from tiny_models import (
    EngineTracker,
    assert_no_kv_leak,
    build_tiny_model,
    random_prompts,
    record_block_copies,
    run_to_completion,
)

from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.errors import InvalidRequestError, KVCacheCapacityError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.metrics import EngineMetrics
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=3)


def _run_one(
    engine: LLMEngine, prompt: list[int], params: SamplingParams, rid: str = "x"
) -> RequestOutput:
    engine.add_request(Request(rid, prompt, params))
    return run_to_completion(engine)[rid]


PROMPT = random_prompts(1, 37, 38, seed=5)[0]


@pytest.mark.parametrize(
    ("prompt", "params", "param"),
    [
        ([], GREEDY, "prompt"),
        (list(range(300)), GREEDY, "prompt"),  # longer than the 256-token context
        (PROMPT, SamplingParams(max_tokens=250), "max_tokens"),  # prompt + completion too long
        (PROMPT, SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2, 2048], GREEDY, "prompt"),  # vocab is 2048
        ([1, -1, 3], GREEDY, "prompt"),
        (PROMPT, SamplingParams(temperature=math.nan), "temperature"),
    ],
    ids=[
        "empty",
        "too-long",
        "no-room",
        "max-tokens-0",
        "id-past-vocab",
        "negative-id",
        "nan-temp",
    ],
)
def test_bad_input_is_refused_and_the_engine_keeps_serving(
    model_dir: Path,
    engines: EngineTracker,
    prompt: list[int],
    params: SamplingParams,
    param: str,
) -> None:
    engine = engines.make(model_dir)
    engine.add_request(Request("good", PROMPT, GREEDY))
    engine.step()
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(Request("bad", prompt, params))
    assert info.value.param == param
    assert info.value.message
    finals = run_to_completion(engine)
    assert set(finals) == {"good"}
    assert len(finals["good"].outputs[0].token_ids) == 24


def test_duplicate_request_id_is_refused(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    engine.add_request(Request("same", PROMPT, GREEDY))
    with pytest.raises(InvalidRequestError, match="already running"):
        engine.add_request(Request("same", PROMPT, GREEDY))


def test_abort_mid_generation_frees_blocks_at_once(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    engine.add_request(
        Request("long", PROMPT, SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))
    )
    engine.add_request(Request("queued", PROMPT, GREEDY))
    for _ in range(5):
        engine.step()
    engine.abort("long")
    engine.abort("queued")
    engine.abort("unknown")  # a no-op, not an error
    bm = engine.scheduler.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # freed by abort(), before any further step
    outputs = {o.request_id: o for o in engine.step()}
    assert outputs["long"].finished and outputs["long"].outputs[0].finish_reason == "abort"
    assert 0 < len(outputs["long"].outputs[0].token_ids) < 100
    assert not engine.has_unfinished()
    assert_no_kv_leak(engine)


def test_stop_token_id_ends_with_stop(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    free_run = _run_one(engine, PROMPT, GREEDY, "free").outputs[0].token_ids
    stop_at = free_run[6]
    first = free_run.index(stop_at)
    params = SamplingParams(
        max_tokens=24, temperature=0.0, ignore_eos=True, stop_token_ids=(stop_at,)
    )
    out = _run_one(engine, PROMPT, params, "stopped").outputs[0]
    assert out.finish_reason == "stop"
    assert out.token_ids == free_run[: first + 1]


def _stream(engine: LLMEngine, rid: str, params: SamplingParams) -> tuple[str, RequestOutput]:
    engine.add_request(Request(rid, PROMPT, params))
    streamed = ""
    final = None
    while engine.has_unfinished():
        for output in engine.step():
            streamed += output.outputs[0].new_text
            assert output.outputs[0].text == streamed  # what was sent is never taken back
            final = output
    assert final is not None and final.finished
    return streamed, final


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_the_text(model_dir: Path, engines: EngineTracker, include: bool) -> None:
    engine = engines.make(model_dir)
    text = _run_one(engine, PROMPT, GREEDY, "free").outputs[0].text
    assert len(text) > 20
    stop = text[10:13]
    cut = text.index(stop)
    params = SamplingParams(
        max_tokens=24,
        temperature=0.0,
        ignore_eos=True,
        stop=(stop,),
        include_stop_str_in_output=include,
    )
    streamed, final = _stream(engine, f"stop-{include}", params)
    expected = text[: cut + len(stop)] if include else text[:cut]
    assert final.outputs[0].finish_reason == "stop"
    assert final.outputs[0].text == expected == streamed


def test_greedy_choices_of_n_equal_a_single_run_and_share_the_prompt(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    single = _run_one(engine, PROMPT, GREEDY, "single").outputs[0].token_ids
    copies = record_block_copies(engine)
    params = SamplingParams(n=3, max_tokens=24, temperature=0.0, ignore_eos=True)
    out = _run_one(engine, PROMPT, params, "n3")
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.token_ids == single for c in out.outputs)
    assert sum(copies) == 2  # 37 tokens: the shared partial block is copied for two of the three
    assert out.metrics.completion_tokens == 72


def test_seeded_sampling_is_the_same_alone_and_batched(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    params = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, n=2)
    alone = _run_one(engine, PROMPT, params, "alone")
    others = random_prompts(5, 5, 60, seed=9)
    for i, prompt in enumerate(others):
        engine.add_request(Request(f"o{i}", prompt, SamplingParams(max_tokens=20, temperature=0.8)))
    engine.add_request(Request("batched", PROMPT, params))
    batched = run_to_completion(engine)["batched"]
    assert [c.token_ids for c in batched.outputs] == [c.token_ids for c in alone.outputs]
    assert alone.outputs[0].token_ids != alone.outputs[1].token_ids  # choices differ (seed + i)


def test_metering_and_timestamps(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    prompts = random_prompts(6, 10, 90, seed=21)
    for i, prompt in enumerate(prompts):
        engine.add_request(
            Request(
                f"m{i}", prompt, SamplingParams(max_tokens=5 + i, temperature=0.0, ignore_eos=True)
            )
        )
    finals = run_to_completion(engine)
    total = sum(o.metrics.device_seconds for o in finals.values())
    assert total == pytest.approx(engine.total_device_seconds, rel=1e-9)
    for i in range(6):
        m = finals[f"m{i}"].metrics
        assert m.prompt_tokens == len(prompts[i]) and m.completion_tokens == 5 + i
        assert m.cached_tokens == 0 and m.device_seconds > 0
        assert m.first_scheduled_time is not None and m.first_token_time is not None
        assert m.finish_time is not None
        assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finish_time
        assert finals[f"m{i}"].outputs[0].finish_reason == "length"


def test_logprobs_are_reported_per_token(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    out = _run_one(engine, PROMPT, params).outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 6
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert entry.token_id == token and entry.logprob <= 0
        assert len(entry.top) == 2 and entry.top[0][0] == token  # greedy: the best one


def test_metrics_are_observed(model_dir: Path, engines: EngineTracker) -> None:
    registry = CollectorRegistry()
    engine = engines.make(model_dir, EngineMetrics(registry, model="tiny"), num_gpu_blocks=20)
    prompts = random_prompts(6, 60, 120, seed=31)
    for i, prompt in enumerate(prompts):
        engine.add_request(
            Request(
                f"p{i}", prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
            )
        )
    run_to_completion(engine)
    labels = {"model": "tiny"}

    def value(name: str) -> float:
        result = registry.get_sample_value(name, labels)
        assert result is not None, name
        return result

    assert value("hydrant_generation_tokens_total") == 6 * 40
    assert value("hydrant_prompt_tokens_total") >= sum(len(p) for p in prompts)
    assert value("hydrant_e2e_request_latency_seconds_count") == 6
    assert value("hydrant_num_preemptions_total") == engine.scheduler.num_preemptions > 0
    assert value("hydrant_num_requests_running") == 0
    assert value("hydrant_kv_cache_usage_perc") == 0.0


def test_engine_refuses_a_kv_pool_too_small_for_one_sequence(model_dir: Path) -> None:
    with pytest.raises(KVCacheCapacityError, match="max_model_len=256"):
        LLMEngine.from_pretrained(model_dir, EngineConfig(num_gpu_blocks=15, show_progress=False))
    with pytest.raises(EngineConfigError, match="exceeds"):
        LLMEngine.from_pretrained(model_dir, EngineConfig(max_model_len=4096, show_progress=False))
    engine = LLMEngine.from_pretrained(
        model_dir, EngineConfig(num_gpu_blocks=4, max_model_len=64, show_progress=False)
    )
    assert engine.max_model_len == 64


def test_eos_stops_unless_ignored_and_not_before_min_tokens(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    free_run = _run_one(engine, PROMPT, GREEDY, "free").outputs[0].token_ids
    eos = free_run[4]
    first = free_run.index(eos)
    engine.processor.eos_token_ids = frozenset({eos})  # pretend the model's EOS is this token
    engine.sampler.eos_token_ids = frozenset({eos})
    stopped = _run_one(engine, PROMPT, SamplingParams(max_tokens=24, temperature=0.0), "eos")
    assert stopped.outputs[0].finish_reason == "stop"
    assert stopped.outputs[0].token_ids == free_run[: first + 1]
    late = SamplingParams(max_tokens=24, temperature=0.0, min_tokens=first + 2)
    held = _run_one(engine, PROMPT, late, "min").outputs[0]
    assert held.token_ids[: first + 1] != free_run[: first + 1]  # EOS was masked at `first`
    assert eos not in held.token_ids[: first + 2]
