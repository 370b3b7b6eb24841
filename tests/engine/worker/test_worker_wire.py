"""The worker's wire format: step frames (many requests each) survive any split, truncation
and garbage are caught."""

from __future__ import annotations

import pytest

from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, RequestUsage, TokenLogprob
from hydrant.engine.worker.wire import (
    MAX_FRAME_BYTES,
    Entry,
    Frame,
    FrameError,
    FrameReader,
    StreamError,
    encode_frame,
    secret_matches,
)


def _chunks() -> list[Frame]:
    usage = RequestUsage(prompt_tokens=3, cached_tokens=0, completion_tokens=2, device_ns=7)
    first = GenerateChunk(
        request_id="r",
        choices=[ChoiceDelta(index=0, token_ids=[5], text="a\n")],
        # echo with logprobs: the prompt's scores travel on the first chunk
        prompt_logprobs=[None, TokenLogprob(4, -1.5, [(4, -1.5), (9, -2.25)])],
    )
    last = GenerateChunk(
        request_id="r",
        choices=[ChoiceDelta(index=0, token_ids=[6], text="b", finish_reason="stop")],
        finished=True,
        usage=usage,
    )
    other = GenerateChunk(request_id="q", choices=[ChoiceDelta(index=0, token_ids=[8], text="c")])
    draining = StreamError(kind="unavailable", message="draining")
    return [
        Frame(entries=[Entry(request_id="r", chunk=first), Entry(request_id="q", chunk=other)]),
        Frame(),  # a keep-alive
        Frame(entries=[Entry(request_id="r", chunk=last), Entry(request_id="q", error=draining)]),
    ]


@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_frames_round_trip_however_the_bytes_are_split(piece: int) -> None:
    frames = _chunks()
    data = b"".join(encode_frame(f) for f in frames)
    reader = FrameReader()
    got: list[Frame] = []
    for start in range(0, len(data), piece):
        got.extend(reader.feed(data[start : start + piece]))
    assert got == frames
    assert reader.pending == 0


def test_a_truncated_stream_leaves_bytes_pending() -> None:
    data = encode_frame(_chunks()[0])
    reader = FrameReader()
    assert list(reader.feed(data[:-2])) == []
    assert reader.pending == len(data) - 2


def test_garbage_and_oversized_frames_are_errors() -> None:
    with pytest.raises(FrameError):
        list(FrameReader().feed(b"\x00\x00\x00\x02\xc1\xc1"))
    with pytest.raises(FrameError):
        list(FrameReader().feed((MAX_FRAME_BYTES + 1).to_bytes(4, "big")))


def test_secret_comparison() -> None:
    assert secret_matches("s3cret", "s3cret")
    assert not secret_matches("s3cre", "s3cret")
    assert not secret_matches(None, "s3cret")
    assert not secret_matches("", "s3cret")
