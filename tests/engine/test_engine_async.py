"""The async front: concurrent streams, abort mid-stream, disconnects, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest
from tiny_models import (
    EngineTracker,
    assert_no_kv_leak,
    build_tiny_model,
    random_prompts,
    run_to_completion,
)

from hydrant.engine.async_engine import AsyncLLMEngine, running
from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
LONG = SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=4)


async def _collect(
    front: AsyncLLMEngine, rid: str, prompt: list[int], params: SamplingParams
) -> list[RequestOutput]:
    return [
        output async for output in front.generate(Request(rid, prompt, params, tenant_id=f"t{rid}"))
    ]


async def test_concurrent_generations_stream_and_finish(
    model_dir: Path, engines: EngineTracker
) -> None:
    prompts = random_prompts(6, 3, 70, seed=41)
    reference_engine = engines.make(model_dir)
    for i, prompt in enumerate(prompts):
        reference_engine.add_request(Request(str(i), prompt, GREEDY))
    expected = {
        rid: o.outputs[0].token_ids for rid, o in run_to_completion(reference_engine).items()
    }

    engine = engines.make(model_dir)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    async with running(engine) as front:
        tick_task = asyncio.create_task(ticker())
        streams = await asyncio.gather(
            *(_collect(front, str(i), p, GREEDY) for i, p in enumerate(prompts))
        )
        tick_task.cancel()
        for i, stream in enumerate(streams):
            # Really streamed: outputs arrive while it runs. The step thread does not wait for
            # the loop (busy here with the ticker), so steps it has not read yet come merged.
            assert 1 < len(stream) <= 20
            assert stream[-1].finished and not any(o.finished for o in stream[:-1])
            assert [t for o in stream for t in o.outputs[0].new_token_ids] == expected[str(i)]
        assert ticks > 20  # the event loop kept running while steps ran in their thread
        assert front.stats().num_running == 0
    assert_no_kv_leak(engine)


async def test_the_engine_steps_on_while_the_event_loop_is_busy(
    model_dir: Path, engines: EngineTracker
) -> None:
    """The step thread does not wait for the loop between steps: while the loop is blocked
    (here 0.5 s, far longer than a step of this model), the request keeps generating,
    and the reader's next output carries every token made meanwhile, once and in order."""
    prompt = random_prompts(1, 8, 9, seed=43)[0]
    reference = engines.make(model_dir)
    reference.add_request(Request("r", prompt, LONG))
    expected = run_to_completion(reference)["r"].outputs[0].token_ids

    async with running(engines.make(model_dir)) as front:
        stream = front.generate(Request("r", prompt, LONG))
        outputs = [await anext(stream)]
        time.sleep(0.5)  # the point: the loop is blocked, not yielding
        outputs += [output async for output in stream]
    assert len(outputs[1].outputs[0].new_token_ids) > 1  # stepped while the loop was blocked
    assert [t for o in outputs for t in o.outputs[0].new_token_ids] == expected
    assert outputs[-1].finished


async def test_abort_mid_stream_frees_blocks(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        received: list[RequestOutput] = []
        async for output in front.generate(Request("a", random_prompts(1, 40, 41)[0], LONG)):
            received.append(output)
            if len(received) == 3:
                assert front.stats().num_free_blocks < front.stats().num_total_blocks
                await front.abort("a")
        assert received[-1].finished
        assert received[-1].outputs[0].finish_reason == "abort"
        assert len(received[-1].outputs[0].token_ids) < 200
        stats = front.stats()
        assert stats.num_free_blocks == stats.num_total_blocks
    assert_no_kv_leak(engine)


async def test_consumer_that_stops_reading_aborts_its_request(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        stream = front.generate(Request("gone", random_prompts(1, 30, 31)[0], LONG))
        async with contextlib.aclosing(stream):
            async for _output in stream:
                break  # the client disconnected
        for _ in range(200):
            if not engine.has_unfinished():
                break
            await asyncio.sleep(0.01)
        assert not engine.has_unfinished()
        stats = front.stats()
        assert stats.num_free_blocks == stats.num_total_blocks
        # the front still serves after it
        assert (await _collect(front, "next", [1, 2, 3], GREEDY))[-1].finished
    assert_no_kv_leak(engine)


async def test_bad_request_raises_before_any_output(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    async with running(engine) as front:
        with pytest.raises(InvalidRequestError) as info:
            await _collect(front, "bad", [], GREEDY)
        assert info.value.param == "prompt"
        assert (await _collect(front, "good", [5, 6, 7], GREEDY))[-1].finished


async def test_shutdown_ends_open_streams_with_abort(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    front = AsyncLLMEngine(engine)
    received: list[RequestOutput] = []

    async def consume() -> None:
        async for output in front.generate(Request("s", [1, 2, 3, 4], LONG)):
            received.append(output)

    task = asyncio.create_task(consume())
    while not received:
        await asyncio.sleep(0.005)
    await front.shutdown()
    await task
    assert received[-1].finished and received[-1].outputs[0].finish_reason == "abort"
    assert_no_kv_leak(engine)
