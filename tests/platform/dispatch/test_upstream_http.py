"""The gateway's streams to an upstream pool member, against real TCP and TLS servers.

`UpstreamHttp` reads an OpenAI server's `/v1/completions` event stream.
`test_upstream_vllm` runs it against a real `vllm serve`; these tests script the
server byte by byte for what a real vLLM does not do on demand: events split
across TCP reads at every byte, TLS, a stream cut short, an error event,
refusals, a silent member, and a client leaving mid-stream (the connection must
close: that is vLLM's abort), and a whole answer's connection kept for the next.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from raw_http_server import RawServer, chunked, read_request, sized

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest, Sampling
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.upstream_http import UpstreamHttp
from hydrant.platform.dispatch.worker_link import WorkerUnavailable

KEY = "sk-upstream-key"
SSE = b"text/event-stream"


def event(token_id: int, text: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "token_ids": [token_id], "finish_reason": finish}
    return {"object": "text_completion", "choices": [choice], "usage": None}


def sse(*events: dict[str, Any], usage: tuple[int, int] | None, done: bool = True) -> bytes:
    """The events as an SSE body, with vLLM's usage-only last event and `[DONE]`."""
    out = [b"data: %s\n\n" % json.dumps(e).encode() for e in events]
    if usage is not None:
        counts = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
        out.append(b"data: %s\n\n" % json.dumps({"choices": [], "usage": counts}).encode())
    if done:
        out.append(b"data: [DONE]\n\n")
    return b"".join(out)


STREAM = sse(event(7, "a"), event(8, "b"), event(9, "c", "length"), usage=(3, 3))


def request(request_id: str = "r1") -> GenerateRequest:
    sampling = Sampling(max_tokens=3, temperature=0.0)
    return GenerateRequest(request_id=request_id, prompt_token_ids=[1, 2, 3], sampling=sampling)


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHttp]:
    client = UpstreamHttp("m", KEY, PoolMetrics(), read_timeout_s=2.0)
    yield client
    await client.aclose()


async def collect(http: UpstreamHttp, address: str, request_id: str = "r1") -> list[GenerateChunk]:
    return [chunk async for chunk in http.generate(address, request(request_id))]


def tokens(chunks: list[GenerateChunk]) -> list[int]:
    return [t for chunk in chunks for delta in chunk.choices for t in delta.token_ids]


async def test_events_split_at_every_byte_arrive_once_and_in_order(
    http: UpstreamHttp,
) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        response = chunked(STREAM, content_type=SSE)
        while True:
            seen.append(await read_request(reader))
            for byte in range(len(response)):
                writer.write(response[byte : byte + 1])
                await writer.drain()

    async with RawServer(handler) as server:
        first = await collect(http, server.address, "r1")
        second = await collect(http, server.address, "r2")
    for chunks in (first, second):
        assert tokens(chunks) == [7, 8, 9]
        assert "".join(d.text for c in chunks for d in c.choices) == "abc"
        assert chunks[-1].finished and chunks[-1].usage is not None
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 3)
        assert [c.finished for c in chunks].count(True) == 1
    head, body = seen[0]
    assert head.startswith(b"POST /v1/completions HTTP/1.1\r\n")
    assert f"authorization: bearer {KEY.lower()}\r\n".encode() in head.lower()
    assert b"content-type: application/json\r\n" in head.lower()
    sent = json.loads(body)
    assert sent["prompt"] == [1, 2, 3] and sent["stream"] is True and sent["model"] == "m"


async def test_an_https_member_is_streamed_over_tls_verified_by_the_trust_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    cafile = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(cafile))
    monkeypatch.setenv("SSL_CERT_FILE", str(cafile))  # the system trust store's override

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await read_request(reader)
            writer.write(chunked(STREAM, content_type=SSE))
            await writer.drain()

    client = UpstreamHttp("m", None, PoolMetrics())
    try:
        async with RawServer(handler, server_tls) as server:
            assert server.address.startswith("https://")
            assert tokens(await collect(client, server.address)) == [7, 8, 9]
            assert tokens(await collect(client, server.address, "r2")) == [7, 8, 9]
    finally:
        await client.aclose()

    monkeypatch.delenv("SSL_CERT_FILE")
    untrusted = UpstreamHttp("m", None, PoolMetrics())  # a CA the trust store lacks
    try:
        async with RawServer(handler, server_tls) as server:
            with pytest.raises(WorkerUnavailable) as failed:
                await collect(untrusted, server.address)
    finally:
        await untrusted.aclose()
    assert failed.value.reason == "connect"


async def test_a_client_that_leaves_mid_stream_closes_the_connection(
    http: UpstreamHttp,
) -> None:
    """Closing the connection is how vLLM learns of an abort: it must not be pooled."""
    closed = asyncio.Event()

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(
            chunked(sse(event(7, "a"), usage=None, done=False), end=False, content_type=SSE)
        )
        await writer.drain()
        if await reader.read(1) == b"":  # EOF: the gateway closed its side
            closed.set()

    async with RawServer(handler) as server:
        stream = http.generate(server.address, request())
        first = await anext(stream)
        assert tokens([first]) == [7]
        await stream.aclose()
        await asyncio.wait_for(closed.wait(), 2.0)  # not the 5 s a finished one may linger


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (chunked(STREAM[:70], end=False, content_type=SSE), "lost"),  # cut mid-stream
        (chunked(sse(event(7, "a"), usage=None), content_type=SSE), "lost"),  # no usage
        (chunked(b"data: {not json\n\n", content_type=SSE), "lost"),
        (chunked(b'data: {"error": {"message": "engine died"}}\n\n', content_type=SSE), "failed"),
    ],
    ids=["cut", "no-usage", "garbled", "error-event"],
)
async def test_a_broken_stream_is_worker_unavailable_with_its_reason(
    http: UpstreamHttp, body: bytes, reason: str
) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(body)
        await writer.drain()
        writer.close()

    async with RawServer(handler) as server:
        with pytest.raises(WorkerUnavailable) as failed:
            await collect(http, server.address)
    assert failed.value.reason == reason


async def test_a_silent_member_fails_after_the_read_timeout(http: UpstreamHttp) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(content_type=SSE, end=False))  # the head, then nothing
        await writer.drain()
        await asyncio.sleep(30)

    async with RawServer(handler) as server:
        with pytest.raises(WorkerUnavailable) as failed:
            await collect(http, server.address)
    assert failed.value.reason == "lost"


@pytest.mark.parametrize(
    ("status", "body", "error", "reason"),
    [
        (400, b'{"error": {"message": "too long", "param": "prompt"}}', InvalidRequestError, None),
        (401, b'{"error": {"message": "bad key"}}', WorkerUnavailable, "unauthorized"),
        (503, b"overloaded", WorkerUnavailable, "unavailable"),
        (500, b'{"detail": "boom"}', WorkerUnavailable, "failed"),
    ],
)
async def test_a_refusal_maps_to_what_dispatch_acts_on(
    http: UpstreamHttp, status: int, body: bytes, error: type[Exception], reason: str | None
) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(sized(status, body) if index == 0 else chunked(STREAM, content_type=SSE))
        await writer.drain()

    async with RawServer(handler) as server:
        with pytest.raises(error) as failed:
            await collect(http, server.address)
        if reason is None:
            assert str(failed.value) == "too long"
        else:
            assert getattr(failed.value, "reason", None) == reason
        assert tokens(await collect(http, server.address, "r2")) == [7, 8, 9]


async def test_an_address_nothing_listens_on_is_a_connect_failure(http: UpstreamHttp) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        return None

    async with RawServer(handler) as server:
        address = server.address  # closed when the block ends: nothing listens there
    with pytest.raises(WorkerUnavailable) as failed:
        await collect(http, address)
    assert failed.value.reason == "connect"


async def test_a_whole_answers_connection_serves_the_next_request(http: UpstreamHttp) -> None:
    """Kept alive after `[DONE]`, even when the response's last HTTP chunk comes a moment
    later (it waits for it briefly): no TCP or TLS handshake per request. A connection left
    mid-stream is closed instead (vLLM's abort): see the test above."""
    served: list[int] = []

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return  # the client closed it
            served.append(index)
            writer.write(chunked(STREAM, content_type=SSE, end=False))
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"0\r\n\r\n")  # the final chunk, after the events
            await writer.drain()

    async with RawServer(handler) as server:
        for request_id in ("r1", "r2", "r3"):
            chunks = await collect(http, server.address, request_id)
            assert tokens(chunks) == [7, 8, 9] and chunks[-1].finished
            await asyncio.sleep(0.2)  # the final chunk is in: the connection is pooled
        assert served == [0, 0, 0] and server.accepted == 1
