"""A worker never leaves a gateway's link silent: keep-alive frames while its request queues.

Why it matters: the gateway treats a link silent for
`HYDRANT_WORKER_STREAM_IDLE_TIMEOUT_S` as dead (test_faults_workers.py), which
is only safe if a live worker always says something. Here a real worker with
one sequence slot holds a long request of one gateway's link; a second
gateway's request queues behind it: its admission answers at once, its link
gets keep-alive frames (no entry), then the tokens when the slot frees.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import httpx
import msgspec
import pytest
import redis
from worker_stack import SECRET, pool_env, redis_prefix, wait_until, worker_processes

from hydrant.engine.protocol import GenerateRequest, Sampling
from hydrant.engine.worker.wire import (
    SECRET_HEADER,
    Admission,
    Entry,
    Frame,
    FrameReader,
    LinkOpening,
    pool_key,
    record_decoder,
    record_key,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def address_of(redis_url: str, prefix: str) -> str | None:
    client = redis.Redis.from_url(redis_url)
    try:
        for worker_id in client.zrange(pool_key(prefix, "demo"), 0, -1):
            raw = client.get(record_key(prefix, worker_id.decode()))
            if raw is not None:
                record = record_decoder.decode(raw)
                if record.state == "ready":
                    return record.address
    finally:
        client.close()
    return None


def request(request_id: str, max_tokens: int) -> GenerateRequest:
    return GenerateRequest(
        request_id=request_id,
        prompt_token_ids=list(range(10, 40)),
        sampling=Sampling(max_tokens=max_tokens, temperature=0, ignore_eos=True),
    )


HEADERS = {SECRET_HEADER: SECRET}


def link(address: str, link_id: str, frames: list[Frame], stop: threading.Event) -> None:
    """Hold a link open as a gateway does, collecting its frames until `stop` and one more
    (or until the worker stops at the end of the test)."""
    with (
        contextlib.suppress(httpx.RemoteProtocolError),
        httpx.stream(
            "POST",
            f"{address}/steps",
            content=msgspec.msgpack.encode(LinkOpening(link_id)),
            headers=HEADERS,
            timeout=60,
        ) as response,
    ):
        assert response.status_code == 200
        reader = FrameReader()
        for data in response.iter_raw():
            frames.extend(reader.feed(data))
            if stop.is_set():
                break


def admit(address: str, link_id: str, body: GenerateRequest) -> int:
    encoded = msgspec.msgpack.encode(Admission(link_id, body))
    return httpx.post(f"{address}/admit", content=encoded, headers=HEADERS).status_code


def opened(address: str, link_id: str, frames: list[Frame], stop: threading.Event) -> None:
    threading.Thread(target=link, args=(address, link_id, frames, stop), daemon=True).start()
    wait_until(lambda: bool(frames), 30, "the link's first frame")


def test_a_queued_request_gets_keepalive_frames_until_it_runs(
    demo_model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    with redis_prefix(redis_url) as prefix:
        env = pool_env(
            redis_url, prefix, HYDRANT_MAX_NUM_SEQS="1", HYDRANT_WORKER_KEEPALIVE_S="0.2"
        )
        with worker_processes(1, demo_model_dir, env, tmp_path):
            wait_until(lambda: address_of(redis_url, prefix) is not None, 120, "a ready worker")
            address = address_of(redis_url, prefix)
            assert address is not None

            hog_frames: list[Frame] = []
            hog_stop = threading.Event()
            opened(address, "hog-link", hog_frames, hog_stop)
            assert admit(address, "hog-link", request("hog", 1900)) == 200
            wait_until(lambda: len(hog_frames) > 1, 30, "the long request to run")

            queued: list[Frame] = []
            opened(address, "queued-link", queued, threading.Event())
            assert admit(address, "queued-link", request("queued", 5)) == 200  # at once
            wait_until(lambda: len(queued) >= 3, 30, "keep-alive frames for the queued request")
            assert all(not f.entries for f in queued[:3])
            assert len(hog_frames) > 3  # the long one was running all along

            hog_stop.set()  # the long request's gateway hangs up: it is aborted, the slot frees

            def entries() -> list[Entry]:
                return [e for f in queued for e in f.entries]

            wait_until(
                lambda: any(e.chunk and e.chunk.finished for e in entries()), 60, "the tokens"
            )
            chunks = [e.chunk for e in entries() if e.chunk is not None]
            assert not [e for e in entries() if e.error is not None]
            assert chunks[-1].finished and chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 5
            assert {e.request_id for e in entries()} == {"queued"}
            first_chunk = next(i for i, f in enumerate(queued) if f.entries)
            assert first_chunk >= 3  # keep-alives came first, then the tokens
