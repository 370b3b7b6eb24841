"""A request's feed on the gateway's link: what a late reader gets (pure logic; the link
against real workers is in tests/engine/worker/test_worker_process.py)."""

from __future__ import annotations

import pytest

from hydrant.engine.protocol import (
    ChoiceDelta,
    FinishReason,
    GenerateChunk,
    RequestUsage,
    TokenLogprob,
)
from hydrant.engine.worker.wire import Entry, StreamError
from hydrant.platform.dispatch.worker_link import Feed, WorkerUnavailable, merge_chunks

USAGE = RequestUsage(prompt_tokens=2, cached_tokens=0, completion_tokens=3, device_ns=5)


def delta(index: int, token: int, finish: FinishReason | None = None) -> ChoiceDelta:
    return ChoiceDelta(
        index=index,
        token_ids=[token],
        text=f"<{token}>",
        finish_reason=finish,
        logprobs=[TokenLogprob(token, -0.5, [(token, -0.5)])],
    )


def chunk(*deltas: ChoiceDelta, finished: bool = False) -> GenerateChunk:
    return GenerateChunk(
        request_id="r", choices=list(deltas), finished=finished, usage=USAGE if finished else None
    )


def test_merged_chunks_keep_each_choice_s_tokens_text_and_logprobs_once_in_order() -> None:
    first = GenerateChunk(
        request_id="r",
        choices=[delta(0, 1), delta(1, 2)],
        prompt_logprobs=[None, TokenLogprob(7, -1.0, [])],
    )
    merged = merge_chunks(
        [
            first,
            chunk(delta(0, 3), delta(1, 4, "stop")),
            chunk(delta(0, 5, "length"), finished=True),
        ]
    )
    by_index = {c.index: c for c in merged.choices}
    assert by_index[0].token_ids == [1, 3, 5] and by_index[0].text == "<1><3><5>"
    assert [e.token_id for e in by_index[0].logprobs or []] == [1, 3, 5]
    assert by_index[1].token_ids == [2, 4] and by_index[1].finish_reason == "stop"
    assert by_index[0].finish_reason == "length"
    assert merged.finished and merged.usage == USAGE
    assert merged.prompt_logprobs == first.prompt_logprobs  # the first chunk's, kept


async def test_a_late_reader_gets_what_piled_up_as_one_chunk_and_errors_in_their_place() -> None:
    feed = Feed()
    for token in (1, 2, 3):
        feed.put(Entry(request_id="r", chunk=chunk(delta(0, token))))
    feed.put(Entry(request_id="r", error=StreamError(kind="failed", message="boom")))
    feed.fail(WorkerUnavailable("lost", "the link broke"))
    merged = await feed.get()
    assert merged.chunk is not None and merged.chunk.choices[0].token_ids == [1, 2, 3]
    error = await feed.get()
    assert error.error is not None and error.error.message == "boom"
    with pytest.raises(WorkerUnavailable, match="the link broke"):
        await feed.get()  # the link's failure, once every entry before it was read
