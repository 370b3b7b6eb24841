"""Prompt logprobs (`SamplingParams.prompt_logprobs`, OpenAI's `echo` with `logprobs`): every
prompt token after the first is scored with the model's raw distribution given the tokens
before it, equal to transformers' own forward, whether the prompt is prefilled in one
step or in chunks, beside other requests, after a prefix-cache hit would have been
possible, and after a preemption computed it again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import (
    EngineTracker,
    build_tiny_model,
    load_hf_model,
    random_prompts,
    run_batch,
)

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("prompt-logprobs"), "gqa", seed=11)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> torch.nn.Module:
    return load_hf_model(model_dir)


def _expected(model: torch.nn.Module, prompt: list[int], k: int) -> list[tuple[float, list[int]]]:
    """transformers: (logprob of prompt token i, top-k ids) for i = 1 .. len - 1."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt])).logits[0].float()
    logprobs = logits.log_softmax(dim=-1)
    return [
        (float(logprobs[i - 1, prompt[i]]), logprobs[i - 1].topk(k).indices.tolist())
        for i in range(1, len(prompt))
    ]


def _scores(outputs: list[RequestOutput]) -> list:
    carrying = [o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None]
    assert len(carrying) == 1, "prompt logprobs come exactly once, in the first output"
    assert outputs[0].prompt_logprobs is not None
    return carrying[0]


def _check(
    scores: list, expected: list[tuple[float, list[int]]], prompt: list[int], k: int
) -> None:
    assert len(scores) == len(prompt) and scores[0] is None
    for i, (entry, (logprob, top_ids)) in enumerate(zip(scores[1:], expected, strict=True), 1):
        assert entry.token_id == prompt[i]
        assert entry.logprob == pytest.approx(logprob, abs=2e-4)
        assert [t for t, _ in entry.top] == top_ids
        assert [v for _, v in entry.top] == sorted((v for _, v in entry.top), reverse=True)
        assert len(entry.top) == k


def test_prompt_scores_match_transformers(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompts = random_prompts(3, 5, 60, seed=2)
    params = [
        SamplingParams(max_tokens=2, temperature=0.0, prompt_logprobs=3),
        SamplingParams(max_tokens=3, temperature=0.0),  # beside one that asks for none
        SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
    ]
    outputs = run_batch(engine, prompts, params)
    _check(_scores(outputs[0]), _expected(reference, prompts[0], 3), prompts[0], 3)
    _check(_scores(outputs[2]), _expected(reference, prompts[2], 0), prompts[2], 0)
    assert all(o.prompt_logprobs is None for o in outputs[1])


def test_a_chunked_prefill_scores_every_chunk_boundary(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    """13 tokens a step: the last position of each chunk scores the next chunk's first."""
    engine = engines.make(
        model_dir, max_num_batched_tokens=13, short_lane_tokens=13, long_lane_tokens=13
    )
    prompt = random_prompts(1, 70, 71, seed=4)[0]
    outputs = run_batch(engine, [prompt], [SamplingParams(max_tokens=2, prompt_logprobs=2)])
    _check(_scores(outputs[0]), _expected(reference, prompt, 2), prompt, 2)


def test_a_cached_prefix_is_computed_again_to_be_scored(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompt = random_prompts(1, 50, 51, seed=6)[0]
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    run_batch(engine, [prompt], [greedy])  # its full blocks are now in the prefix cache
    scored = run_batch(engine, [prompt], [SamplingParams(max_tokens=1, prompt_logprobs=1)])
    assert scored[0][-1].metrics.cached_tokens == 0
    _check(_scores(scored[0]), _expected(reference, prompt, 1), prompt, 1)
    again = run_batch(engine, [prompt], [greedy])
    assert again[0][-1].metrics.cached_tokens > 0  # the cache itself still works


def test_a_preempted_prompt_is_scored_once(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    """Few blocks: requests are preempted and computed again; no score is added twice."""
    engine = engines.make(
        model_dir, num_gpu_blocks=12, max_model_len=128, enable_prefix_caching=False
    )
    prompts = random_prompts(4, 30, 40, seed=8)
    params = [SamplingParams(max_tokens=24, ignore_eos=True, prompt_logprobs=1)] * 4
    outputs = run_batch(engine, prompts, params)
    assert sum(out[-1].metrics.num_preemptions for out in outputs.values()) > 0
    for i, prompt in enumerate(prompts):
        _check(_scores(outputs[i]), _expected(reference, prompt, 1), prompt, 1)


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompt = random_prompts(1, 20, 21, seed=9)[0]
    outputs = run_batch(engine, [prompt], [SamplingParams(max_tokens=0, prompt_logprobs=2)])
    last = outputs[0][-1]
    assert last.finished and last.metrics.completion_tokens == 0
    assert last.outputs[0].token_ids == [] and last.outputs[0].text == ""
    assert last.outputs[0].finish_reason == "length"
    _check(_scores(outputs[0]), _expected(reference, prompt, 2), prompt, 2)
    with pytest.raises(InvalidRequestError, match="0 only with prompt_logprobs"):
        SamplingParams(max_tokens=0).validate()


def test_a_one_token_prompt_has_nothing_to_score(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    outputs = run_batch(engine, [[5]], [SamplingParams(max_tokens=1, prompt_logprobs=2)])
    assert _scores(outputs[0]) == [None]


@pytest.mark.parametrize("value", [-1, 21, 1.5, True])
def test_prompt_logprobs_out_of_range_is_refused(value: object) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(prompt_logprobs=value).validate(vocab_size=100)  # type: ignore[arg-type]
    assert refused.value.param == "prompt_logprobs"
