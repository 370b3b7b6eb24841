"""A reader that falls behind gets merged outputs: one read, every token once, in order."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import EngineTracker, assert_no_kv_leak, build_tiny_model

from hydrant.engine.async_engine import AsyncLLMEngine, RequestStream, running
from hydrant.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput, merge_outputs
from hydrant.engine.sampler import TokenLogprob
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

# n = 2 sampled choices with a seed: the same tokens however the outputs are read
SCORED = SamplingParams(
    n=2, max_tokens=24, temperature=0.9, seed=7, ignore_eos=True, logprobs=2, prompt_logprobs=1
)
PROMPT = [5, 9, 13, 2, 40, 41, 7]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=4)


async def _read_all(stream: RequestStream) -> list[RequestOutput]:
    outputs: list[RequestOutput] = []
    while not stream.finished:
        output = await stream.next()
        if output is not None:
            outputs.append(output)
    stream.close()
    return outputs


async def _until_done(front: AsyncLLMEngine) -> None:
    """Every accepted request has run to its end (sleep waits for them), nobody reading."""
    await front.sleep()
    await front.wake()


def _deltas(outputs: list[RequestOutput], index: int) -> tuple[list[int], str]:
    tokens = [t for o in outputs for c in o.outputs if c.index == index for t in c.new_token_ids]
    text = "".join(c.new_text for o in outputs for c in o.outputs if c.index == index)
    return tokens, text


async def test_a_late_reader_gets_one_output_equal_to_the_whole_stream(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        eager = await _read_all(await front.open(Request("eager", PROMPT, SCORED)))
        assert len(eager) > 2  # read as they came: one output per step

        late = await front.open(Request("late", PROMPT, SCORED))
        await _until_done(front)  # every step ran while nobody read
        merged = await _read_all(late)
        assert len(merged) == 1 and merged[0].finished

        final = eager[-1]
        for index in (0, 1):
            assert _deltas(merged, index) == _deltas(eager, index)
            choice = merged[0].outputs[index]
            assert choice.new_token_ids == choice.token_ids == final.outputs[index].token_ids
            assert choice.new_text == choice.text == final.outputs[index].text
            assert choice.finish_reason == "length"
            assert choice.logprobs == final.outputs[index].logprobs
            assert choice.logprobs is not None and len(choice.logprobs) == 24
        # the prompt's scores: once, on the (only) output
        expected_scores = next(o.prompt_logprobs for o in eager if o.prompt_logprobs)
        assert merged[0].prompt_logprobs == expected_scores
        assert merged[0].metrics.completion_tokens == final.metrics.completion_tokens
    assert_no_kv_leak(engine)


async def test_a_reader_that_falls_behind_mid_stream_loses_nothing(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        eager = await _read_all(await front.open(Request("eager", PROMPT, SCORED)))
        stream = await front.open(Request("behind", PROMPT, SCORED))
        first = await stream.next()
        assert first is not None and not first.finished
        await _until_done(front)
        rest = await _read_all(stream)
        assert len(rest) == 1 and rest[0].finished
        for index in (0, 1):
            assert _deltas([first, *rest], index) == _deltas(eager, index)
        # prompt scores come with the first output only, as when read eagerly
        assert first.prompt_logprobs is not None and rest[0].prompt_logprobs is None
    assert_no_kv_leak(engine)


async def test_take_returns_none_when_nothing_is_waiting(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        quiet = await front.open(Request("quiet", PROMPT, SamplingParams(max_tokens=1)))
        assert (await _read_all(quiet))[-1].finished
        assert quiet.take() is None  # read out: nothing waits, and take() does not wait
    assert_no_kv_leak(engine)


def _choice(index: int, tokens: list[int], new: int, reason: str | None = None) -> CompletionOutput:
    text = "".join(chr(97 + t % 26) for t in tokens)
    return CompletionOutput(
        index=index,
        token_ids=tokens,
        new_token_ids=tokens[len(tokens) - new :],
        text=text,
        new_text=text[len(text) - new :],
        finish_reason=reason,  # type: ignore[arg-type]
        logprobs=[TokenLogprob(t, -1.0, []) for t in tokens],
    )


def _output(choices: list[CompletionOutput], finished: bool, **extra: object) -> RequestOutput:
    metrics = RequestMetrics(
        prompt_tokens=3,
        cached_tokens=0,
        completion_tokens=sum(len(c.token_ids) for c in choices),
        arrival_time=0.0,
        first_scheduled_time=None,
        first_token_time=None,
        finish_time=None,
        device_seconds=0.0,
    )
    return RequestOutput("r", choices, finished, metrics, **extra)  # type: ignore[arg-type]


def test_merge_keeps_each_choice_delta_and_the_once_only_parts() -> None:
    scores = [None, TokenLogprob(4, -0.5, [])]
    older = _output([_choice(0, [1, 2], 2), _choice(1, [3], 1)], False, prompt_logprobs=scores)
    # choice 1 has nothing new in the newer output and is missing from it altogether
    newer = _output([_choice(0, [1, 2, 5], 1, "length")], True, embedding=[1.0])
    merged = merge_outputs(older, newer)
    assert [c.index for c in merged.outputs] == [0, 1]
    assert merged.outputs[0].new_token_ids == [1, 2, 5]
    assert merged.outputs[0].new_text == "bcf"
    assert merged.outputs[0].finish_reason == "length"
    assert merged.outputs[0].logprobs == newer.outputs[0].logprobs
    assert merged.outputs[1] == older.outputs[1]
    assert merged.prompt_logprobs == scores and merged.embedding == [1.0]
    assert merged.finished and merged.metrics is newer.metrics
