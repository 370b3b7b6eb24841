"""The worker's internal HTTP API (Litestar), spoken only by the gateway.

Every route but `/healthz` needs the shared secret (`x-hydrant-worker-secret`, or
`Authorization: Bearer` for Prometheus' scrapes; compared in constant time): a
worker runs a model on a device and takes requests in any tenant's name, so
nothing but the gateway may reach it.

Generation runs over one link per gateway (see `step_link`): `POST /steps`
(a msgpack `LinkOpening`) answers a stream of length-prefixed msgpack frames
that stays open as long as the gateway keeps it, one frame per engine step
with every new chunk and error of that gateway's requests, an empty one every
`keepalive_s` when there is nothing to say, so the gateway can treat a silent
link as dead (a worker cut off by the network) after a short idle timeout.
`POST /admit` (an `Admission`) starts a request on a link and answers at
once: a request the engine refuses is a plain 400, one the worker cannot take
(asleep, draining) a 503 the gateway retries elsewhere; what the engine
refuses later (while adding it) comes on the link as the request's error.
`POST /cancel` (a `Cancellation`) aborts one of a link's requests.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.connection import ASGIConnection
from litestar.exceptions import NotAuthorizedException
from litestar.handlers.base import BaseRouteHandler
from litestar.response import Stream
from prometheus_client import generate_latest

from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.worker.runtime import WorkerRuntime, WorkerUnavailableError
from hydrant.engine.worker.step_link import UNAVAILABLE, StepLinks
from hydrant.engine.worker.wire import (
    FRAME_MEDIA_TYPE,
    SECRET_HEADER,
    Admission,
    Cancellation,
    ErrorBody,
    ErrorKind,
    LinkOpening,
    StreamError,
    secret_matches,
)

log = logging.getLogger(__name__)

_opening_decoder = msgspec.msgpack.Decoder(LinkOpening)
_admission_decoder = msgspec.msgpack.Decoder(Admission)
_cancellation_decoder = msgspec.msgpack.Decoder(Cancellation)
_json = msgspec.json.Encoder()


class LoadBody(msgspec.Struct, frozen=True, kw_only=True):
    path: str | None = None
    quantization: str | None = None


def _error(status: int, kind: ErrorKind, message: str, param: str | None = None) -> Response[bytes]:
    body = ErrorBody(error=StreamError(kind=kind, message=message, param=param))
    return Response(_json.encode(body), status_code=status, media_type="application/json")


def _json_response(payload: object, status: int = 200) -> Response[bytes]:
    return Response(_json.encode(payload), status_code=status, media_type="application/json")


def create_worker_app(runtime: WorkerRuntime) -> Litestar:
    links = StepLinks(runtime)

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

    @post("/steps", guards=[require_secret], status_code=200)
    async def steps(request: Request[Any, Any, Any]) -> Response[Any]:
        try:
            opening = _opening_decoder.decode(await request.body())
            link = links.open(opening.link_id)
        except msgspec.DecodeError as exc:
            return _error(400, "invalid", f"malformed link request: {exc}")
        except InvalidRequestError as exc:
            return _error(409, "invalid", exc.message, exc.param)
        return Stream(link.frames(), media_type=FRAME_MEDIA_TYPE)

    @post("/admit", guards=[require_secret], status_code=200)
    async def admit(request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            admission = _admission_decoder.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _error(400, "invalid", f"malformed generate request: {exc}")
        link = links.get(admission.link_id)
        if link is None:
            return _error(503, "unavailable", "no such link: the gateway must open a new one")
        try:
            await link.admit(admission.request)
        except InvalidRequestError as exc:
            return _error(400, "invalid", exc.message, exc.param)
        except UNAVAILABLE as exc:
            return _error(503, "unavailable", str(exc) or "the worker is not taking requests")
        except EngineError as exc:
            return _error(500, "failed", str(exc))
        return Response(b"", media_type="application/json")

    @post("/cancel", guards=[require_secret], status_code=200)
    async def cancel(request: Request[Any, Any, Any]) -> Response[bytes]:
        try:
            cancellation = _cancellation_decoder.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _error(400, "invalid", f"malformed cancel request: {exc}")
        link = links.get(cancellation.link_id)
        if link is not None:
            await link.abort(cancellation.request_id)
        return Response(b"", media_type="application/json")

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
            steps,
            admit,
            cancel,
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
    app.state.links = links
    return app
