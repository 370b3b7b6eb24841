"""The worker's frames for a gateway that reads late: merged chunks, every token once, in order.

`_frames` waits on the request's engine stream once per frame; while the
gateway has not taken a frame (its socket full, its loop busy) the engine
keeps stepping and the next frame carries every token since. Driven here by a
reader that pauses after each frame, against a real engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from hydrant.engine.protocol import GenerateChunk, GenerateRequest, Sampling
from hydrant.engine.worker.app import _frames
from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime
from hydrant.engine.worker.wire import FrameReader

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = 40
SAMPLING = Sampling(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("llama"), "llama", seed=4)


@pytest.fixture
async def runtime(model_dir: Path) -> AsyncIterator[WorkerRuntime]:
    options = WorkerOptions(model="tiny", path=str(model_dir), secret="s", kv_cache_bytes=1 << 22)
    runtime = WorkerRuntime(options)
    await runtime.load()
    try:
        yield runtime
    finally:
        await runtime.unload()


async def read(runtime: WorkerRuntime, request_id: str, pause_s: float) -> list[GenerateChunk]:
    """The chunks of a request's frames, read with `pause_s` after each frame (as the
    handler does: the request counted in, then its frames)."""
    request = GenerateRequest(
        request_id=request_id, prompt_token_ids=[5, 9, 13, 2], sampling=SAMPLING
    )
    runtime.enter()
    stream = await runtime.open(request)
    reader = FrameReader()
    chunks: list[GenerateChunk] = []
    async for data in _frames(runtime, stream, None):
        for frame in reader.feed(data):
            assert frame.error is None
            if frame.chunk is not None:  # else a keep-alive frame
                chunks.append(frame.chunk)
        await asyncio.sleep(pause_s)
    assert reader.pending == 0
    return chunks


def tokens(chunks: list[GenerateChunk]) -> list[int]:
    return [t for chunk in chunks for choice in chunk.choices for t in choice.token_ids]


async def test_a_late_reader_gets_fewer_frames_with_every_token_once_in_order(
    runtime: WorkerRuntime,
) -> None:
    eager = await read(runtime, "eager", 0.0)
    late = await read(runtime, "late", 0.03)  # a tiny model steps in about a millisecond
    assert len(tokens(eager)) == TOKENS
    assert tokens(late) == tokens(eager)
    assert "".join(c.choices[0].text for c in late) == "".join(c.choices[0].text for c in eager)
    logprobs = [e.token_id for c in late for e in c.choices[0].logprobs or []]
    assert logprobs == tokens(eager)  # each token's logprob once, with its token
    assert len(late) < TOKENS / 2  # merged: the frames carried several steps each
    assert late[-1].finished and not any(c.finished for c in late[:-1])
    assert late[-1].usage is not None and late[-1].usage.completion_tokens == TOKENS
    assert runtime.inflight == 0  # the frames' end counted the request out


async def test_a_reader_that_leaves_is_counted_out_and_its_request_ends(
    runtime: WorkerRuntime,
) -> None:
    request = GenerateRequest(request_id="gone", prompt_token_ids=[1, 2, 3], sampling=SAMPLING)
    runtime.enter()
    stream = await runtime.open(request)
    frames = _frames(runtime, stream, None)
    await frames.__anext__()
    await frames.aclose()  # the gateway went away
    assert runtime.inflight == 0
    assert runtime.engine is not None
    for _ in range(200):
        if not runtime.engine.engine.has_unfinished():
            break
        await asyncio.sleep(0.01)
    assert not runtime.engine.engine.has_unfinished()
