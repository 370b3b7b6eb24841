"""The gateway's HTTP client to an upstream pool's members (OpenAI-compatible servers).

It stands where `WorkerHttp` stands for Hydrant workers, so the pool's
dispatch (routing, retry on another member before the first token, drain)
is the same code for both. Failures are sorted the same way: a member that
refuses or cannot be reached is `WorkerUnavailable` (retried elsewhere if
nothing reached the client yet), a request the member rejects as bad is
`InvalidRequestError` (a 400 no other member would accept either).

Abort is closing the stream: vLLM aborts a request whose client disconnects.
The streams go over `StreamClient` (httptools, one write per request): httpx,
with httpcore, h11 and anyio under it, was about a third of the gateway's CPU
per upstream token (py-spy at 20 requests/s), CPU a front shares with the
engine wherever they share cores. A connection that carried a whole answer
is kept for the next request (no TCP or TLS handshake each time; httpx closed
them, the response's last chunk being unread at `[DONE]`); one left
mid-stream is closed. Health probes stay on httpx.
Of control calls a member takes only sleep mode's (vLLM's `/sleep?level=1`,
`/wake_up`, `/is_sleeping`, where its pool sleeps: `HYDRANT_UPSTREAM_SLEEP`),
sent with the control key; never a worker's `/drain` or the worker secret.
Billing uses the gateway's own counts (the prompt it sent, the token ids it
received); the upstream's `usage` is checked against them, and a mismatch is
logged (ids and counts, never text) and counted in a metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from typing import Any, NoReturn

import httpx
import msgspec

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import GenerateChunk, GenerateRequest, RequestUsage
from hydrant.platform.dispatch.metrics import PoolMetrics
from hydrant.platform.dispatch.stream_client import (
    StreamBusy,
    StreamClient,
    StreamClientError,
    StreamConnectError,
)
from hydrant.platform.dispatch.upstream_cost import MemberCost
from hydrant.platform.dispatch.upstream_wire import (
    SseLines,
    UpstreamUsage,
    chunk_of,
    completion_body,
    error_message,
    event_decoder,
)
from hydrant.platform.dispatch.worker_http import WorkerUnavailable

log = logging.getLogger(__name__)
_encoder = msgspec.json.Encoder()


# Level 1: weights to host memory, KV cache dropped; `wait`: requests in flight finish first
# (vLLM's default, `abort`, would end a request that came in as the idle check decided).
SLEEP_PATH = "/sleep?level=1&mode=wait"
WAKE_PATH = "/wake_up"
SLEEPING_PATH = "/is_sleeping"


class UpstreamHttp:
    """Streams completions from the members of one model's upstream pool.

    `read_timeout_s`: the longest a member may stay silent on a stream (an
    OpenAI server sends nothing while a request queues or prefills).
    `control_key`: sent on sleep mode's calls (None: the API key's headers).

    Sleep is level 1 only: level 2 drops the weights too, and vLLM then
    serves garbage until its caller reloads them (`/collective_rpc`), a step
    for RL weight updates, not for serving.
    """

    sleep_path = SLEEP_PATH
    wake_path = WAKE_PATH

    def __init__(
        self,
        model: str,
        api_key: str | None,
        metrics: PoolMetrics,
        read_timeout_s: float = 600.0,
        control_key: str | None = None,
    ) -> None:
        self.model = model
        self.metrics = metrics
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.control_headers = (
            {"authorization": f"Bearer {control_key}"} if control_key else self.headers
        )
        self._streams = StreamClient(
            "/v1/completions",
            {"content-type": "application/json", "accept": "text/event-stream", **self.headers},
            connect_timeout_s=3.0,
            idle_timeout_s=read_timeout_s,
            max_idle_per_address=256,
            max_connections_per_address=4096,
            pool_timeout_s=30.0,
            peer="upstream",
        )
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=3.0))
        self._costs: dict[str, MemberCost] = {}
        self.metrics.usage_mismatches.labels(model, "prompt_tokens")  # exported as 0
        self.metrics.usage_mismatches.labels(model, "completion_tokens")

    async def generate(
        self, address: str, request: GenerateRequest
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The request's chunks; the last one is `finished` with the usage billed."""
        body = _encoder.encode(completion_body(request, self.model))
        cost = self._costs.setdefault(address, MemberCost())
        started = time.monotonic()
        try:
            response = await self._streams.post(address, body)
        except StreamConnectError as exc:
            raise WorkerUnavailable("connect", str(exc)) from exc
        except StreamBusy as exc:
            raise WorkerUnavailable("unavailable", str(exc)) from exc
        except StreamClientError as exc:
            raise WorkerUnavailable("lost", f"upstream request failed: {exc}") from exc
        prompt_tokens = len(request.prompt_token_ids)
        cost.start(request.request_id, prompt_tokens)
        complete = False  # the whole answer arrived: the connection may serve another
        try:
            if response.status != 200:
                _raise_refusal(response.status, await response.read_all())
            counted: dict[int, int] = {}  # completion token ids received, per choice
            usage: UpstreamUsage | None = None
            lines = SseLines()
            done = False
            while not done and (data := await response.read()):  # b"": the response ended
                for payload in lines.feed(data):
                    if payload is None:  # [DONE]
                        done = True
                        break
                    event = event_decoder.decode(payload)
                    if event.error is not None:
                        raise WorkerUnavailable("failed", event.error.message)
                    if event.usage is not None:
                        usage = event.usage
                    chunk = chunk_of(request.request_id, event)
                    if chunk is not None:
                        for delta in chunk.choices:
                            got = len(delta.token_ids)
                            if got:
                                counted[delta.index] = counted.get(delta.index, 0) + got
                                cost.grow(request.request_id, got)
                        yield chunk
            if usage is None:
                raise WorkerUnavailable("lost", "the upstream's stream ended without its usage")
            seconds = cost.finish(request.request_id)
            complete = done
            yield GenerateChunk(
                request_id=request.request_id,
                choices=[],
                finished=True,
                usage=self._billed(request, usage, counted, seconds, time.monotonic() - started),
            )
        except msgspec.DecodeError as exc:
            raise WorkerUnavailable("lost", f"garbled stream from the upstream: {exc}") from exc
        except StreamClientError as exc:
            raise WorkerUnavailable("lost", f"upstream stream failed: {exc}") from exc
        finally:
            cost.finish(request.request_id)
            # Kept alive after a whole answer (its last HTTP chunk may still be on its way);
            # closed mid-stream, which is how vLLM learns the client left and aborts.
            response.release(complete)

    def _billed(
        self,
        request: GenerateRequest,
        upstream: UpstreamUsage,
        counted: dict[int, int],
        device_seconds: float,
        e2e_seconds: float,
    ) -> RequestUsage:
        """The usage billed: the gateway's counts, checked against the upstream's.

        Without token ids in the stream (a server that ignores `return_token_ids`)
        the gateway has no count of its own: the upstream's completion count stands.
        """
        prompt = len(request.prompt_token_ids)
        completion = sum(counted.values()) if counted else upstream.completion_tokens
        for name, ours, theirs in (
            ("prompt_tokens", prompt, upstream.prompt_tokens),
            ("completion_tokens", completion, upstream.completion_tokens),
        ):
            if ours != theirs:
                self.metrics.usage_mismatches.labels(self.model, name).inc()
                log.warning(
                    "upstream usage differs from the gateway's count",
                    extra={
                        "model": self.model,
                        "request_id": request.request_id,
                        "field": name,
                        "gateway": ours,
                        "upstream": theirs,
                    },
                )
        details = upstream.prompt_tokens_details
        cached = (details.cached_tokens or 0) if details is not None else 0
        return RequestUsage(
            prompt_tokens=prompt,
            cached_tokens=max(0, min(cached, prompt)),
            completion_tokens=completion,
            device_ns=int(device_seconds * 1e9),
            e2e_seconds=e2e_seconds,
        )

    async def call(
        self, address: str, method: str, path: str, body: Any = None, timeout_s: float = 30.0
    ) -> Any:
        """Sleep mode's calls (`sleep_path`, `wake_path`); a worker's others (`/drain`,
        `/stats`) an upstream does not take. vLLM answers both when done (a wake
        with the weights back in device memory)."""
        if method != "POST" or path not in (SLEEP_PATH, WAKE_PATH):
            raise WorkerUnavailable("failed", f"an upstream member takes no {path} call")
        try:
            response = await self._client.post(
                f"{address}{path}", headers=self.control_headers, timeout=timeout_s
            )
        except httpx.HTTPError as exc:
            raise WorkerUnavailable(
                "connect", f"cannot reach the upstream: {type(exc).__name__}"
            ) from exc
        if response.status_code in (401, 403):
            raise WorkerUnavailable(
                "unauthorized", f"the upstream refused the control key ({path})"
            )
        if response.status_code >= 300:
            message, _ = error_message(response.content)
            raise WorkerUnavailable(
                "failed", f"upstream answered HTTP {response.status_code} to {path}: {message}"
            )
        return None

    async def is_sleeping(self, url: str, timeout_s: float) -> bool | None:
        """Whether the member sleeps (vLLM's `/is_sleeping`); None: it does not say (no
        sleep mode there, or not in vLLM's dev mode, or the control key refused)."""
        try:
            response = await self._client.get(
                f"{url}{SLEEPING_PATH}", headers=self.control_headers, timeout=timeout_s
            )
            answer = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        sleeping = answer.get("is_sleeping") if isinstance(answer, dict) else None
        return sleeping if isinstance(sleeping, bool) else None

    async def abort(self, address: str, request_id: str) -> None:
        """Nothing to send: closing the request's stream (dispatch does) aborts it upstream."""
        return None

    async def get(self, url: str, timeout_s: float) -> httpx.Response:
        """A health probe's GET, with the upstream key (vLLM's `--api-key` guards `/v1`)."""
        return await self._client.get(url, headers=self.headers, timeout=timeout_s)

    async def aclose(self) -> None:
        await self._streams.aclose()
        await self._client.aclose()


def _raise_refusal(status: int, body: bytes) -> NoReturn:
    message, param = error_message(body)
    if status in (400, 422):
        raise InvalidRequestError(message or f"the upstream refused the request ({status})", param)
    if status in (401, 403):
        raise WorkerUnavailable("unauthorized", "the upstream refused the gateway's API key")
    if status in (404, 409, 429, 502, 503, 504):
        raise WorkerUnavailable("unavailable", f"upstream answered HTTP {status}")
    raise WorkerUnavailable("failed", f"upstream answered HTTP {status}")
