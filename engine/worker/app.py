"""The worker's internal HTTP API (Litestar), spoken only by the gateway.

Every route but `/healthz` needs the shared secret (`x-hydrant-worker-secret`, or
`Authorization: Bearer` for Prometheus' scrapes; compared in constant time): a
worker runs a model on a device and takes requests in any tenant's name, so
nothing but the gateway may reach it.

`POST /generate` takes a msgpack `GenerateRequest` and answers a stream of
length-prefixed msgpack frames (see `wire`). It waits for the first chunk
before answering, so a request the engine refuses is a plain 400, and one the
worker cannot take (asleep, draining) is a 503 the gateway retries elsewhere.
A stream never stays silent longer than `keepalive_s`: while a request queues
or prefills (before its first chunk, too: then the answer starts with
keep-alive frames and a refusal comes as an error frame) an empty frame goes
out every `keepalive_s`, so the gateway can treat a silent connection as dead
(a worker cut off by the network) after a short idle timeout instead of
waiting minutes for a long prefill that may be running.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.response import Stream
from prometheus_client import generate_latest

from hydrant.engine.async_engine import EngineShutdownError, RequestStream
from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.inprocess import to_chunk
from hydrant.engine.protocol import GenerateChunk, GenerateRequest
from hydrant.engine.worker.runtime import WorkerRuntime, WorkerUnavailableError
from hydrant.engine.worker.wire import (
    FRAME_MEDIA_TYPE,
    SECRET_HEADER,
    ErrorBody,
    ErrorKind,
    Frame,
    StreamError,
    encode_frame,
    secret_matches,
)

log = logging.getLogger(__name__)

_request_decoder = msgspec.msgpack.Decoder(GenerateRequest)
_json = msgspec.json.Encoder()


class LoadBody(msgspec.Struct, frozen=True, kw_only=True):
    path: str | None = None
    quantization: str | None = None


def _unavailable_types() -> tuple[type[BaseException], ...]:
    kinds: list[type[BaseException]] = [WorkerUnavailableError, EngineShutdownError]
    try:  # the engine's sleep mode (raised by a sleeping engine)
        from hydrant.engine.sleep_mode import EngineSleepingError

        kinds.append(EngineSleepingError)
    except ImportError:  # pragma: no cover - older engines
        pass
    return tuple(kinds)


UNAVAILABLE = _unavailable_types()


def _error(status: int, kind: ErrorKind, message: str, param: str | None = None) -> Response[bytes]:
    body = ErrorBody(error=StreamError(kind=kind, message=message, param=param))
    return Response(_json.encode(body), status_code=status, media_type="application/json")


def _json_response(payload: object, status: int = 200) -> Response[bytes]:
    return Response(_json.encode(payload), status_code=status, media_type="application/json")


def create_worker_app(runtime: WorkerRuntime) -> Litestar:
    async def require_secret(
        connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
    ) -> None:
        # The gateway sends its header; Prometheus (a PodMonitor) can only send a bearer token.
        given = connection.headers.get(SECRET_HEADER)
        if given is None:
            scheme, _sep, token = connection.headers.get("authorization", "").partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else None
        if not secret_matches(given, runtime.options.secret):
            raise NotAuthorizedException("a valid worker secret is required")

    @get("/healthz", sync_to_thread=False)
    def healthz() -> Response[bytes]:
        # Open (probes carry no secret); 200 once the model serves, 503 before/while away.
        status = 200 if runtime.state in ("ready", "sleeping") else 503
        return _json_response({"state": runtime.state}, status)

    @get("/info", guards=[require_secret], sync_to_thread=False)
    def info() -> Response[bytes]:
        return _json_response(runtime.record())

    @get("/stats", guards=[require_secret], sync_to_thread=False)
    def stats() -> Response[bytes]:
        return _json_response(
            {"state": runtime.state, "inflight": runtime.inflight, "stats": runtime.stats()}
        )

    @get(
        "/metrics",
        guards=[require_secret],
        sync_to_thread=False,
        media_type="text/plain; version=0.0.4",
    )
    def metrics() -> Response[bytes]:
        return Response(
            generate_latest(runtime.metrics_registry), media_type="text/plain; version=0.0.4"
        )

    @post("/generate", guards=[require_secret], status_code=200)
    async def generate(request: Request[Any, Any, Any]) -> Response[Any]:
        try:
            body = _request_decoder.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _error(400, "invalid", f"malformed generate request: {exc}")
        runtime.enter()
        handed_off = False
        stream: RequestStream | None = None
        try:
            stream = await runtime.open(body)
            output = await stream.next(runtime.options.keepalive_s)  # raises a refusal
            first = None if output is None else to_chunk(output)
            if first is not None and _given_back(runtime, first):
                return _error(503, "unavailable", "the worker drained before running the request")
            # None: queued or prefilling; answer now, keep-alive frames until it starts.
            handed_off = True
            return Stream(_frames(runtime, stream, first), media_type=FRAME_MEDIA_TYPE)
        except InvalidRequestError as exc:
            return _error(400, "invalid", exc.message, exc.param)
        except UNAVAILABLE as exc:
            return _error(503, "unavailable", str(exc) or "the worker is not taking requests")
        except EngineError as exc:
            return _error(500, "failed", str(exc))
        finally:
            if not handed_off:  # answered here, or the gateway went away while we waited
                if stream is not None:
                    stream.close()
                runtime.leave()

    @post("/abort/{request_id:str}", guards=[require_secret], status_code=200)
    async def abort(request_id: str) -> Response[bytes]:
        await runtime.abort(request_id)
        return _json_response({"aborted": request_id})

    @post("/sleep", guards=[require_secret], status_code=200)
    async def sleep() -> Response[bytes]:
        try:
            await runtime.sleep()
        except WorkerUnavailableError as exc:
            return _error(409, "unavailable", str(exc))
        except AttributeError:
            return _error(501, "failed", "this engine has no sleep mode")
        return _json_response({"state": runtime.state})

    @post("/wake", guards=[require_secret], status_code=200)
    async def wake() -> Response[bytes]:
        try:
            await runtime.wake()
        except WorkerUnavailableError as exc:
            return _error(409, "unavailable", str(exc))
        return _json_response({"state": runtime.state})

    @post("/load", guards=[require_secret], status_code=200)
    async def load(request: Request[Any, Any, Any]) -> Response[bytes]:
        raw = await request.body()
        try:
            body = msgspec.json.decode(raw or b"{}", type=LoadBody)
        except msgspec.DecodeError as exc:
            return _error(400, "invalid", f"malformed load request: {exc}")
        try:
            await runtime.load(body.path, body.quantization)
        except RuntimeError as exc:
            return _error(409, "unavailable", str(exc))
        except (EngineError, OSError, ValueError) as exc:
            return _error(422, "failed", f"cannot load the model: {exc}")
        return _json_response({"state": runtime.state, "path": runtime.path})

    @post("/unload", guards=[require_secret], status_code=200)
    async def unload() -> Response[bytes]:
        await runtime.unload()
        return _json_response({"state": runtime.state})

    @post("/drain", guards=[require_secret], status_code=202)
    async def drain(request: Request[Any, Any, Any]) -> Response[bytes]:
        # The same path as SIGTERM: the process exits once the drain is done.
        request.app.state.request_drain()
        return _json_response({"state": "draining"}, 202)

    app = Litestar(
        route_handlers=[
            healthz,
            info,
            stats,
            metrics,
            generate,
            abort,
            sleep,
            wake,
            load,
            unload,
            drain,
        ],
        logging_config=None,
        debug=False,
        request_max_body_size=64 * 1024 * 1024,
    )
    app.state.request_drain = lambda: None
    return app


def _given_back(runtime: WorkerRuntime, first: GenerateChunk) -> bool:
    """A request a draining worker aborted before it ran: nothing was produced, so retry it."""
    produced = any(c.token_ids for c in first.choices)
    reasons = {c.finish_reason for c in first.choices}
    return runtime.state == "draining" and first.finished and not produced and reasons == {"abort"}


KEEPALIVE_FRAME = encode_frame(Frame())  # no chunk, no error: the gateway skips it


def _error_frame(exc: Exception, started: bool) -> bytes:
    """The frame that ends a stream whose request failed after the answer began."""
    if isinstance(exc, InvalidRequestError):
        kind: ErrorKind = "failed" if started else "invalid"  # refused at the start
        return encode_frame(
            Frame(error=StreamError(kind=kind, message=exc.message, param=exc.param))
        )
    if isinstance(exc, UNAVAILABLE):
        message = str(exc) or "the worker stopped"
        return encode_frame(Frame(error=StreamError(kind="unavailable", message=message)))
    log.error("generation failed in the worker", exc_info=exc)
    return encode_frame(Frame(error=StreamError(kind="failed", message=type(exc).__name__)))


async def _frames(
    runtime: WorkerRuntime, stream: RequestStream, first: GenerateChunk | None
) -> AsyncIterator[bytes]:
    """The request's frames, with a keep-alive frame whenever none came for `keepalive_s`.

    One wait per frame, on the request's stream with a deadline: what the engine
    produced while the previous frame was being written is merged into the next.
    """
    chunk = first
    started = False
    keepalive_s = runtime.options.keepalive_s
    try:
        while True:
            if chunk is None:
                yield KEEPALIVE_FRAME
            else:
                if not started and _given_back(runtime, chunk):
                    message = "the worker drained before running the request"
                    error = StreamError(kind="unavailable", message=message)
                    yield encode_frame(Frame(error=error))
                    return
                started = True
                yield encode_frame(Frame(chunk=chunk))
                if chunk.finished:
                    return
            try:
                output = await stream.next(keepalive_s)
            except Exception as exc:
                yield _error_frame(exc, started)
                return
            chunk = None if output is None else to_chunk(output)
    finally:
        stream.close()  # aborts an unfinished request
        runtime.leave()
