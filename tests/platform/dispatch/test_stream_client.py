"""The step stream's HTTP client against real TCP servers scripted byte by byte.

`StreamClient` carries a gateway's link to each worker (`POST /steps`, a body of
step frames) and its admit and cancel calls. `FrameStream` below reads one
response as a link's reader does (frames in, failures mapped by
`worker_http`'s own functions) but without the per-request split, which
`test_worker_link` checks against real workers. Each test runs an
`asyncio.start_server` on a free port that reads the real request off the
socket and answers raw HTTP/1.1, so what is checked is the
client's behaviour on the wire: frame order, keep-alive reuse (counted as
accepted connections), the retry of a keep-alive connection the worker closed
while idle, and the mapping of every failure to `WorkerUnavailable` reasons.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
import uvloop
from raw_http_server import Handler, RawServer, chunked, read_request, sized

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import (
    ChoiceDelta,
    GenerateChunk,
    GenerateRequest,
    RequestUsage,
    Sampling,
)
from hydrant.engine.worker.wire import (
    MSGPACK_MEDIA_TYPE,
    SECRET_HEADER,
    Entry,
    ErrorBody,
    Frame,
    FrameError,
    FrameReader,
    StreamError,
    encode_frame,
)
from hydrant.platform.dispatch.stream_client import (
    StreamClient,
    StreamClientError,
    StreamConnectError,
    StreamSilent,
)
from hydrant.platform.dispatch.worker_http import (
    WorkerHttp,
    WorkerUnavailable,
    _raise_refusal,
    _stream_failure,
)

SECRET = "s3cret"


def chunk(i: int, finished: bool = False) -> GenerateChunk:
    return GenerateChunk(
        request_id="r1",
        choices=[ChoiceDelta(index=0, token_ids=[i], text=f"t{i}")],
        finished=finished,
        usage=RequestUsage(prompt_tokens=3, cached_tokens=0, completion_tokens=i, device_ns=1)
        if finished
        else None,
    )


def frame(chunk: GenerateChunk | None = None, error: StreamError | None = None) -> Frame:
    return Frame(entries=[Entry(request_id="r1", chunk=chunk, error=error)])


def stream_body(tokens: int = 3) -> bytes:
    """A worker's frames: a keep-alive frame, `tokens` chunks, the last one finished."""
    frames = [encode_frame(Frame())]
    frames += [encode_frame(frame(chunk=chunk(i, i == tokens))) for i in range(1, tokens + 1)]
    return b"".join(frames)


def error_body(kind: str, message: str, param: str | None = None) -> bytes:
    error = StreamError(kind=kind, message=message, param=param)
    return msgspec.json.encode(ErrorBody(error=error))


def request() -> GenerateRequest:
    return GenerateRequest(request_id="r1", prompt_token_ids=[1, 2, 3], sampling=Sampling())


def keep_alive_server(response: bytes) -> Handler:
    """Answers every request on a connection with `response`, for as long as it stays open."""

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await read_request(reader)
            writer.write(response)
            await writer.drain()

    return handler


class FrameStream:
    """One POST whose body is read as a link's reader reads it, failures mapped alike."""

    def __init__(
        self, idle_timeout_s: float = 0.5, max_connections: int = 1024, pool_timeout_s: float = 30
    ) -> None:
        self.client = StreamClient(
            "/steps",
            {SECRET_HEADER: SECRET, "content-type": MSGPACK_MEDIA_TYPE},
            idle_timeout_s=idle_timeout_s,
            max_connections_per_address=max_connections,
            pool_timeout_s=pool_timeout_s,
        )
        self.control = WorkerHttp(SECRET)

    async def generate(self, address: str, body: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        finished = False
        try:
            response = await self.client.post(address, msgspec.msgpack.encode(body))
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        try:
            if response.status != 200:
                _raise_refusal(response.status, await response.read_all())
            reader = FrameReader()
            while data := await response.read():
                for got in reader.feed(data):
                    for entry in got.entries:
                        if entry.error is not None:
                            if entry.error.kind == "invalid":
                                raise InvalidRequestError(entry.error.message, entry.error.param)
                            raise WorkerUnavailable(entry.error.kind, entry.error.message)
                        assert entry.chunk is not None
                        finished = entry.chunk.finished
                        yield entry.chunk
                        if finished:
                            return
            raise WorkerUnavailable("lost", "the worker's stream ended")
        except FrameError as exc:
            raise WorkerUnavailable("lost", f"garbled stream from the worker: {exc}") from exc
        except StreamClientError as exc:
            raise _stream_failure(exc) from exc
        finally:
            response.release(finished)

    async def call(self, address: str, method: str, path: str) -> None:
        await self.control.call(address, method, path)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.control.aclose()


@pytest.fixture
async def http() -> AsyncIterator[FrameStream]:
    client = FrameStream(idle_timeout_s=0.5)
    yield client
    await client.aclose()


async def collect(http: FrameStream, address: str) -> list[GenerateChunk]:
    return [c async for c in http.generate(address, request())]


async def failure(http: FrameStream, address: str) -> tuple[WorkerUnavailable, int]:
    """The WorkerUnavailable a generate ends with, and how many chunks came before it."""
    got = 0
    with pytest.raises(WorkerUnavailable) as info:
        async for _ in http.generate(address, request()):
            got += 1
    return info.value, got


# ---- streams that succeed ------------------------------------------------------------------


async def test_a_chunked_stream_arrives_in_order_and_the_connection_is_reused(
    http: FrameStream,
) -> None:
    body = stream_body(3)
    async with RawServer(keep_alive_server(chunked(body[:5], body[5:30], body[30:]))) as server:
        for _ in range(3):
            chunks = await collect(http, server.address)
            assert [c.choices[0].token_ids for c in chunks] == [[1], [2], [3]]
            assert chunks[-1].finished and chunks[-1].usage is not None
        assert server.accepted == 1


async def test_the_request_on_the_wire_carries_the_secret_and_the_msgpack_body(
    http: FrameStream,
) -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        seen.append(await read_request(reader))
        writer.write(chunked(stream_body(1)))
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        await collect(http, server.address)
        address = server.address
    head, body = seen[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /steps HTTP/1.1"
    assert f"host: {address.removeprefix('http://')}" in lines
    assert f"{SECRET_HEADER}: {SECRET}" in lines
    assert "content-type: application/msgpack" in lines
    assert msgspec.msgpack.decode(body, type=GenerateRequest) == request()


async def test_a_content_length_response_is_read_and_reused(http: FrameStream) -> None:
    async with RawServer(keep_alive_server(sized(200, stream_body(4)))) as server:
        for _ in range(2):
            chunks = await collect(http, server.address)
            assert [c.choices[0].token_ids[0] for c in chunks] == [1, 2, 3, 4]
        assert server.accepted == 1


async def test_frames_split_into_one_byte_tcp_reads(http: FrameStream) -> None:
    response = chunked(stream_body(2)[:7], stream_body(2)[7:])

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await read_request(reader)
            for i in range(len(response)):
                writer.write(response[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0.001)

    async with RawServer(handler) as server:
        chunks = await collect(http, server.address)
        assert [c.choices[0].token_ids[0] for c in chunks] == [1, 2]
        await asyncio.sleep(0.1)  # the response's last bytes, after the finished frame
        assert (await collect(http, server.address))[-1].finished
        assert server.accepted == 1


async def test_the_final_chunk_arriving_after_the_finished_frame_still_pools_the_connection(
    http: FrameStream,
) -> None:
    response = chunked(stream_body(2), end=False)

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await read_request(reader)
            writer.write(response)
            await writer.drain()
            await asyncio.sleep(0.05)  # the consumer has its finished chunk by now
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with RawServer(handler) as server:
        for _ in range(2):
            assert (await collect(http, server.address))[-1].finished
            await asyncio.sleep(0.1)
        assert server.accepted == 1
        assert http.client.lingering_connections() == 0  # none kept once its chunk came


async def test_connection_close_is_honoured(http: FrameStream) -> None:
    response = sized(200, stream_body(1), b"connection: close\r\n")

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(response)
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        for _ in range(2):
            assert (await collect(http, server.address))[-1].finished
        assert server.accepted == 2


# ---- the keep-alive connection the worker closed while idle --------------------------------


async def test_an_idle_connection_the_server_closed_is_skipped(http: FrameStream) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(stream_body(1)))
        await writer.drain()  # then closes, as uvicorn does after its keep-alive timeout

    async with RawServer(handler) as server:
        await collect(http, server.address)
        await asyncio.sleep(0.1)
        assert http.client.idle_connections(server.address) == 0
        assert (await collect(http, server.address))[-1].finished
        assert server.accepted == 2


async def test_a_reused_connection_closed_before_any_byte_is_retried_once_on_a_fresh_one(
    http: FrameStream,
) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(stream_body(1)))
        await writer.drain()
        if index == 0:
            await read_request(reader)  # the second request races the keep-alive close

    async with RawServer(handler) as server:
        await collect(http, server.address)
        assert (await collect(http, server.address))[-1].finished
        assert server.accepted == 2


async def test_a_reused_connection_cut_after_response_bytes_is_not_retried(
    http: FrameStream,
) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(stream_body(1)))
        await writer.drain()
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-enc")
        await writer.drain()

    async with RawServer(handler) as server:
        await collect(http, server.address)
        error, got = await failure(http, server.address)
        assert (error.reason, got) == ("lost", 0)
        assert server.accepted == 1


# ---- streams that fail ---------------------------------------------------------------------


async def test_a_connection_cut_mid_stream_is_lost_and_not_retried(http: FrameStream) -> None:
    body = stream_body(3)

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(body[: len(body) // 2], end=False))
        await writer.drain()

    async with RawServer(handler) as server:
        error, got = await failure(http, server.address)
        assert error.reason == "lost"
        assert got >= 1
        assert server.accepted == 1


async def test_a_body_that_ends_without_a_finished_chunk_is_lost(http: FrameStream) -> None:
    body = encode_frame(frame(chunk=chunk(1)))
    async with RawServer(keep_alive_server(chunked(body))) as server:
        error, got = await failure(http, server.address)
        assert (error.reason, got) == ("lost", 1)


async def test_a_garbled_frame_is_lost(http: FrameStream) -> None:
    async with RawServer(keep_alive_server(chunked(b"\x00\x00\x00\x02\xc1\xc1"))) as server:
        error, _ = await failure(http, server.address)
        assert error.reason == "lost"
        assert "garbled" in error.message


async def test_a_malformed_http_response_is_lost(http: FrameStream) -> None:
    async with RawServer(keep_alive_server(b"HTTP/1.1 2x0 OK\r\n\r\n")) as server:
        error, _ = await failure(http, server.address)
        assert error.reason == "lost"


@pytest.mark.parametrize(("kind", "reason"), [("unavailable", "unavailable"), ("failed", "failed")])
async def test_an_error_frame_maps_to_its_kind(http: FrameStream, kind: str, reason: str) -> None:
    error = StreamError(kind=kind, message="gone")
    frames = encode_frame(frame(chunk=chunk(1))) + encode_frame(frame(error=error))
    async with RawServer(keep_alive_server(chunked(frames))) as server:
        failed, got = await failure(http, server.address)
        assert (failed.reason, failed.message, got) == (reason, "gone", 1)


async def test_an_invalid_error_frame_is_the_callers_fault(http: FrameStream) -> None:
    error = StreamError(kind="invalid", message="bad n", param="n")
    async with RawServer(keep_alive_server(chunked(encode_frame(frame(error=error))))) as server:
        with pytest.raises(InvalidRequestError) as info:
            await collect(http, server.address)
        assert info.value.param == "n"


async def test_a_silent_stream_is_silent_after_the_idle_timeout(http: FrameStream) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(encode_frame(frame(chunk=chunk(1))), end=False))
        await writer.drain()
        await asyncio.sleep(30)

    async with RawServer(handler) as server:
        started = time.monotonic()
        error, got = await failure(http, server.address)
        assert (error.reason, got) == ("silent", 1)
        assert 0.45 < time.monotonic() - started < 3.0


async def test_a_server_that_never_answers_is_silent(http: FrameStream) -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    async with RawServer(handler) as server:
        error, got = await failure(http, server.address)
        assert (error.reason, got) == ("silent", 0)


async def test_keep_alive_frames_keep_a_slow_stream_alive(http: FrameStream) -> None:
    keep_alive = encode_frame(Frame())

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(end=False))
        for _ in range(6):  # 1.2 s in all, longer than the 0.5 s idle timeout
            writer.write(b"%x\r\n%s\r\n" % (len(keep_alive), keep_alive))
            await writer.drain()
            await asyncio.sleep(0.2)
        body = stream_body(1)
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        assert (await collect(http, server.address))[-1].finished


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_refused_port_is_connect(http: FrameStream) -> None:
    error, _ = await failure(http, f"http://127.0.0.1:{free_port()}")
    assert error.reason == "connect"


@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (401, b"", "unauthorized"),
        (401, error_body("invalid", "x"), "unauthorized"),
        (409, error_body("unavailable", "draining"), "unavailable"),
        (503, error_body("unavailable", "asleep"), "unavailable"),
        (400, error_body("failed", "odd"), "failed"),
        (500, error_body("failed", "boom"), "failed"),
        (503, b"<html>proxy error</html>", "failed"),
    ],
)
async def test_a_refusal_maps_like_the_control_calls(
    http: FrameStream, status: int, body: bytes, reason: str
) -> None:
    async with RawServer(keep_alive_server(sized(status, body))) as server:
        error, got = await failure(http, server.address)
        assert (error.reason, got) == (reason, 0)
        with pytest.raises(WorkerUnavailable) as control:
            await http.call(server.address, "POST", "/drain")
        assert (control.value.reason, control.value.message) == (reason, error.message)
        error, _ = await failure(http, server.address)
        assert error.reason == reason
        assert server.accepted == 2  # one for generate (reused), one for httpx


async def test_a_refused_request_400_invalid_is_the_callers_fault(http: FrameStream) -> None:
    body = error_body("invalid", "malformed", "prompt")
    async with RawServer(keep_alive_server(sized(400, body))) as server:
        with pytest.raises(InvalidRequestError) as info:
            await collect(http, server.address)
        assert info.value.param == "prompt"


async def test_a_chunked_refusal_body_is_read_whole(http: FrameStream) -> None:
    body = error_body("unavailable", "asleep")
    response = chunked(body[:5], body[5:]).replace(b"200 OK", b"503 Service Unavailable")
    async with RawServer(keep_alive_server(response)) as server:
        error, _ = await failure(http, server.address)
        assert (error.reason, error.message) == ("unavailable", "asleep")


# ---- the consumer stopping early, and closing ----------------------------------------------


async def test_a_consumer_that_stops_early_closes_the_connection(http: FrameStream) -> None:
    first = encode_frame(frame(chunk=chunk(1)))
    closed = asyncio.Event()

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(first, end=False))
        await writer.drain()
        if index == 0:
            assert await reader.read() == b""  # the client hung up
            closed.set()
        else:
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(stream_body(1)), stream_body(1)))
            await writer.drain()
            await reader.read()

    async with RawServer(handler) as server:
        stream = http.generate(server.address, request())
        async with contextlib.aclosing(stream):
            async for got in stream:
                assert got.choices[0].token_ids == [1]
                break
        await asyncio.wait_for(closed.wait(), 2)
        assert http.client.idle_connections(server.address) == 0
        assert (await collect(http, server.address))[-1].finished
        assert server.accepted == 2


async def test_aclose_closes_the_pooled_connections() -> None:
    closed = asyncio.Event()

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(stream_body(1)))
        await writer.drain()
        assert await reader.read() == b""
        closed.set()

    http = FrameStream()
    async with RawServer(handler) as server:
        await collect(http, server.address)
        assert http.client.idle_connections(server.address) == 1
        await http.aclose()
        await asyncio.wait_for(closed.wait(), 2)


async def test_aclose_closes_a_connection_still_waiting_for_its_last_chunk() -> None:
    """Released whole, its final HTTP chunk not in yet: neither in use nor pooled, it would
    outlive the client (an unclosed transport when the loop ends) without this."""
    closed = asyncio.Event()

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(stream_body(1), end=False))  # the final chunk never comes
        await writer.drain()
        assert await reader.read() == b""
        closed.set()

    http = FrameStream()
    async with RawServer(handler) as server:
        assert (await collect(http, server.address))[-1].finished
        assert http.client.idle_connections(server.address) == 0
        assert http.client.lingering_connections() == 1  # waiting for its last chunk
        await http.aclose()
        await asyncio.wait_for(closed.wait(), 2)


async def test_a_slow_consumer_pauses_reading_above_a_mebibyte() -> None:
    body = b"x" * (8 * 1024 * 1024)
    async with RawServer(keep_alive_server(sized(200, body))) as server:
        client = StreamClient("/steps", {}, idle_timeout_s=0.5)
        try:
            response = await client.post(server.address, b"")
            await asyncio.sleep(0.2)  # the server writes all it can; the client stops reading
            assert response._paused
            assert response._buffered < 2 * 1024 * 1024
            await asyncio.sleep(0.6)  # longer than the idle timeout: not the worker's silence
            received = 0
            while data := await response.read():
                received += len(data)
            assert received == len(body)
            response.release(True)
            assert client.idle_connections(server.address) == 1
        finally:
            await client.aclose()


async def test_silence_while_the_consumer_waits_is_a_stream_silent() -> None:
    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await read_request(reader)
        writer.write(chunked(b"abc", end=False))
        await writer.drain()
        await asyncio.sleep(30)

    async with RawServer(handler) as server:
        client = StreamClient("/steps", {}, idle_timeout_s=0.3)
        try:
            response = await client.post(server.address, b"")
            await asyncio.sleep(0.5)  # busy consumer: not counted
            assert await response.read() == b"abc"
            with pytest.raises(StreamSilent):
                await response.read()
            response.release(False)
        finally:
            await client.aclose()


# ---- the same on uvloop, which the gateway runs on (uvicorn's default loop) ----------------

ON_UVLOOP: list[Callable[[FrameStream], Awaitable[None]]] = [
    test_a_chunked_stream_arrives_in_order_and_the_connection_is_reused,
    test_a_content_length_response_is_read_and_reused,
    test_frames_split_into_one_byte_tcp_reads,
    test_the_final_chunk_arriving_after_the_finished_frame_still_pools_the_connection,
    test_an_idle_connection_the_server_closed_is_skipped,
    test_a_reused_connection_closed_before_any_byte_is_retried_once_on_a_fresh_one,
    test_a_reused_connection_cut_after_response_bytes_is_not_retried,
    test_a_connection_cut_mid_stream_is_lost_and_not_retried,
    test_a_malformed_http_response_is_lost,
    test_a_silent_stream_is_silent_after_the_idle_timeout,
    test_a_refused_port_is_connect,
    test_a_chunked_refusal_body_is_read_whole,
    test_a_consumer_that_stops_early_closes_the_connection,
]


@pytest.mark.parametrize("scenario", ON_UVLOOP, ids=lambda f: f.__name__.removeprefix("test_"))
def test_on_uvloop(scenario: Callable[[FrameStream], Awaitable[None]]) -> None:
    async def run() -> None:
        http = FrameStream(idle_timeout_s=0.5)
        try:
            await scenario(http)
        finally:
            await http.aclose()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


# ---- the cap on connections per worker -----------------------------------------------------


def gated_server(gate: asyncio.Event, close_after: bool = False) -> Handler:
    """Answers each request once `gate` is set; `close_after`: then closes the connection."""

    async def handler(
        index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            await read_request(reader)
            await gate.wait()
            extra = b"connection: close\r\n" if close_after else b""
            writer.write(sized(200, stream_body(1), extra))
            await writer.drain()
            if close_after:
                return

    return handler


async def _post_and_read(client: StreamClient, address: str) -> bytes:
    response = await client.post(address, b"{}")
    try:
        return await response.read_all()
    finally:
        response.release(True)


async def test_requests_over_the_cap_wait_for_a_connection_and_reuse_it() -> None:
    gate = asyncio.Event()
    client = StreamClient("/steps", {}, max_connections_per_address=2)
    try:
        async with RawServer(gated_server(gate)) as server:
            posts = [
                asyncio.ensure_future(_post_and_read(client, server.address)) for _ in range(5)
            ]
            await asyncio.sleep(0.2)
            assert server.accepted == 2  # the other three wait for one of these two
            assert client.open_connections(server.address) == 2
            assert not any(p.done() for p in posts)
            gate.set()
            bodies = await asyncio.wait_for(asyncio.gather(*posts), 5)
            assert all(body == stream_body(1) for body in bodies)
            assert server.accepted == 2  # every waiter got a released connection
            assert client.idle_connections(server.address) == 2
    finally:
        await client.aclose()


async def test_a_request_waiting_past_the_pool_timeout_is_busy_and_the_worker_not_blamed() -> None:
    gate = asyncio.Event()
    http = FrameStream(max_connections=1, pool_timeout_s=0.2)
    try:
        async with RawServer(gated_server(gate)) as server:
            first = asyncio.ensure_future(collect(http, server.address))
            await asyncio.sleep(0.05)
            error, got = await failure(http, server.address)
            assert (error.reason, got) == ("busy", 0)
            assert "stayed busy" in error.message
            gate.set()
            assert (await asyncio.wait_for(first, 5))[-1].finished  # the held one still ends
            assert server.accepted == 1
            assert (await collect(http, server.address))[-1].finished  # and its slot is free
            assert server.accepted == 1
    finally:
        await http.aclose()


async def test_a_connection_that_closes_frees_its_slot_for_a_waiter() -> None:
    gate = asyncio.Event()
    client = StreamClient("/steps", {}, max_connections_per_address=1)
    try:
        async with RawServer(gated_server(gate, close_after=True)) as server:
            posts = [
                asyncio.ensure_future(_post_and_read(client, server.address)) for _ in range(3)
            ]
            await asyncio.sleep(0.1)
            assert server.accepted == 1
            gate.set()
            await asyncio.wait_for(asyncio.gather(*posts), 5)
            assert server.accepted == 3  # each closed after its answer: a new one per waiter
            await asyncio.sleep(0.05)
            assert client.open_connections(server.address) == 0
    finally:
        await client.aclose()


async def test_a_waiter_that_gives_up_loses_no_slot() -> None:
    gate = asyncio.Event()
    client = StreamClient("/steps", {}, max_connections_per_address=1)
    try:
        async with RawServer(gated_server(gate)) as server:
            first = asyncio.ensure_future(_post_and_read(client, server.address))
            await asyncio.sleep(0.05)
            quitter = asyncio.ensure_future(_post_and_read(client, server.address))
            await asyncio.sleep(0.05)
            quitter.cancel()  # the client of this request went away while it waited
            with contextlib.suppress(asyncio.CancelledError):
                await quitter
            gate.set()
            await asyncio.wait_for(first, 5)
            assert await asyncio.wait_for(_post_and_read(client, server.address), 5)
            assert server.accepted == 1
            assert client.open_connections(server.address) == 1
            assert client.idle_connections(server.address) == 1
    finally:
        await client.aclose()


async def test_a_refused_connection_frees_its_slot() -> None:
    client = StreamClient("/steps", {}, max_connections_per_address=1, pool_timeout_s=0.2)
    try:
        address = f"http://127.0.0.1:{free_port()}"
        for _ in range(3):  # each attempt is refused, none waits for the slot of the last
            with pytest.raises(StreamConnectError):
                await client.post(address, b"{}")
        assert client.open_connections(address) == 0
    finally:
        await client.aclose()
