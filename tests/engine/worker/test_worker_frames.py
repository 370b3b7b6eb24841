"""A worker's step links against a real engine: one frame per step for all of a gateway's
requests, each request's tokens once and in order, links kept apart.

A link's writer takes everything ready once per wake-up; while the gateway has
not taken a frame (its socket full, its loop busy) the engine keeps stepping
and the next frame carries every token since. Driven here by readers that
pause after each frame, without HTTP (the process tests cover that).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tiny_models import build_tiny_model

from hydrant.engine.protocol import GenerateChunk, GenerateRequest, Sampling
from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime
from hydrant.engine.worker.step_link import StepLink, StepLinks
from hydrant.engine.worker.wire import Frame, FrameReader

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


def request(request_id: str, prompt: list[int]) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, prompt_token_ids=prompt, sampling=SAMPLING)


async def read(link: StepLink, want: set[str], pause_s: float) -> list[Frame]:
    """The link's frames until every request in `want` finished, `pause_s` after each."""
    reader = FrameReader()
    frames: list[Frame] = []
    left = set(want)
    stream = link.frames()
    try:
        async for data in stream:
            for frame in reader.feed(data):
                frames.append(frame)
                for entry in frame.entries:
                    assert entry.error is None, entry.error
                    assert entry.chunk is not None and entry.request_id in want
                    if entry.chunk.finished:
                        left.discard(entry.request_id)
            if not left:
                break
            await asyncio.sleep(pause_s)
    finally:
        await stream.aclose()
    assert reader.pending == 0
    return frames


def chunks_of(frames: list[Frame], request_id: str) -> list[GenerateChunk]:
    return [e.chunk for f in frames for e in f.entries if e.request_id == request_id and e.chunk]


def tokens(chunks: list[GenerateChunk]) -> list[int]:
    return [t for chunk in chunks for choice in chunk.choices for t in choice.token_ids]


PROMPTS = {"a": [5, 9, 13, 2], "b": [7, 3, 11, 8, 1]}


async def alone(runtime: WorkerRuntime, links: StepLinks, name: str) -> list[int]:
    link = links.open(f"alone-{name}")
    await link.admit(request(name, PROMPTS[name]))
    return tokens(chunks_of(await read(link, {name}, 0.0), name))


async def test_two_requests_on_one_link_share_frames_and_each_gets_its_own_tokens(
    runtime: WorkerRuntime,
) -> None:
    links = StepLinks(runtime)
    expected = {name: await alone(runtime, links, name) for name in PROMPTS}
    assert expected["a"] != expected["b"] and all(len(t) == TOKENS for t in expected.values())

    link = links.open("shared")
    for name, prompt in PROMPTS.items():
        await link.admit(request(name, prompt))
    frames = await read(link, set(PROMPTS), 0.03)  # a tiny model steps in about a millisecond
    for name in PROMPTS:
        chunks = chunks_of(frames, name)
        assert tokens(chunks) == expected[name]  # the same as alone, once each, in order
        logprobs = [e.token_id for c in chunks for e in c.choices[0].logprobs or []]
        assert logprobs == expected[name]
        assert chunks[-1].finished and not any(c.finished for c in chunks[:-1])
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == TOKENS
        assert all(c.request_id == name for c in chunks)  # the gateway's id, not the engine's
    assert any(len(f.entries) == 2 for f in frames)  # one frame carried both requests
    assert len(frames) < TOKENS / 2  # the late reader got merged frames
    assert runtime.inflight == 0  # each finish counted its request out
    assert len(links) == 0  # the closed links are gone


async def test_two_links_with_the_same_request_id_never_mix(runtime: WorkerRuntime) -> None:
    links = StepLinks(runtime)
    first, second = links.open("g1"), links.open("g2")
    await first.admit(request("same", PROMPTS["a"]))
    await second.admit(request("same", PROMPTS["b"]))
    got_a, got_b = await asyncio.gather(read(first, {"same"}, 0.0), read(second, {"same"}, 0.0))
    assert tokens(chunks_of(got_a, "same")) == await alone(runtime, links, "a")
    assert tokens(chunks_of(got_b, "same")) == await alone(runtime, links, "b")


async def test_aborting_one_request_leaves_the_other_running(runtime: WorkerRuntime) -> None:
    links = StepLinks(runtime)
    link = links.open("g")
    await link.admit(request("a", PROMPTS["a"]))
    await link.admit(request("b", PROMPTS["b"]))
    await link.abort("a")
    frames = await read(link, {"a", "b"}, 0.0)
    aborted, whole = chunks_of(frames, "a"), chunks_of(frames, "b")
    assert aborted[-1].choices[0].finish_reason == "abort" and len(tokens(aborted)) < TOKENS
    assert whole[-1].choices[0].finish_reason == "length" and len(tokens(whole)) == TOKENS


async def test_a_link_that_goes_away_aborts_its_requests_and_counts_them_out(
    runtime: WorkerRuntime,
) -> None:
    links = StepLinks(runtime)
    link = links.open("gone")
    await link.admit(request("a", PROMPTS["a"]))
    await link.admit(request("b", PROMPTS["b"]))
    assert runtime.inflight == 2
    frames = link.frames()
    await frames.__anext__()
    await frames.aclose()  # the gateway's connection went away
    assert runtime.inflight == 0 and len(links) == 0
    assert runtime.engine is not None
    for _ in range(200):
        if not runtime.engine.engine.has_unfinished():
            break
        await asyncio.sleep(0.01)
    assert not runtime.engine.engine.has_unfinished()
    with pytest.raises(Exception, match="closed"):
        await link.admit(request("c", PROMPTS["a"]))  # a closed link admits nothing
    assert links.open("gone") is not link  # the same gateway reconnecting gets a fresh link
