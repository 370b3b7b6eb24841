"""A worker never leaves a generate stream silent: keep-alive frames while a request queues.

Why it matters: the gateway treats a stream silent for
`HYDRANT_WORKER_STREAM_IDLE_TIMEOUT_S` as a dead link (test_faults_workers.py),
which is only safe if a live worker always says something. Here a real worker
with one sequence slot holds a long request; a second one queues behind it
and must get its 200 and keep-alive frames (no chunk, no error) at once, then
its tokens when the slot frees.
"""

from __future__ import annotations

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
    Frame,
    FrameReader,
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


def stream(address: str, body: GenerateRequest, frames: list[Frame], stop: threading.Event) -> int:
    with httpx.stream(
        "POST",
        f"{address}/generate",
        content=msgspec.msgpack.encode(body),
        headers={SECRET_HEADER: SECRET},
        timeout=60,
    ) as response:
        reader = FrameReader()
        for data in response.iter_raw():
            frames.extend(reader.feed(data))
            if stop.is_set():
                break
        return response.status_code


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
            hog = threading.Thread(
                target=stream,
                args=(address, request("hog", 1900), hog_frames, hog_stop),
                daemon=True,
            )
            hog.start()
            wait_until(lambda: any(f.chunk for f in hog_frames), 30, "the long request to run")

            queued: list[Frame] = []
            status: list[int] = []
            waiter = threading.Thread(
                target=lambda: status.append(
                    stream(address, request("queued", 5), queued, threading.Event())
                ),
                daemon=True,
            )
            waiter.start()
            wait_until(lambda: len(queued) >= 2, 30, "keep-alive frames for the queued request")
            assert all(f.chunk is None and f.error is None for f in queued[:2])
            assert not hog_stop.is_set() and hog.is_alive()  # it really was waiting its turn

            hog_stop.set()  # the long request's client hangs up: it is aborted, the slot frees
            hog.join(60)
            waiter.join(60)
            assert status == [200]
            chunks = [f.chunk for f in queued if f.chunk is not None]
            assert not [f for f in queued if f.error is not None]
            assert chunks and chunks[-1].finished and chunks[-1].usage is not None
            assert chunks[-1].usage.completion_tokens == 5
            first_chunk = next(i for i, f in enumerate(queued) if f.chunk is not None)
            assert first_chunk >= 2  # keep-alives came first, then the tokens
