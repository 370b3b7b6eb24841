"""What a worker and the gateway's dispatcher share: plain data, no torch.

Like `hydrant.engine.protocol`, this module is data only, so the platform may
import it: the Redis record a worker heartbeats, the key names of the worker
registry, the bodies of the link calls and the framing of a step stream, and
the secret check.

A gateway's step stream (`POST /steps`, one per gateway and worker) is a
sequence of frames, each a 4-byte big-endian length followed by a
msgpack-encoded `Frame`: per engine step, one `Entry` for each of that
gateway's requests that has something new (chunk or error); no entry at all
is a keep-alive. Length-prefixed binary frames cannot be confused by text that
contains newlines, and a truncated stream (a worker that died) is detected as
a short read instead of being parsed as a shorter answer.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Iterator
from typing import Literal

import msgspec

from hydrant.engine.protocol import EngineStats, GenerateChunk, GenerateRequest

WorkerState = Literal["starting", "ready", "sleeping", "draining", "unloaded"]
WORKER_STATES: tuple[WorkerState, ...] = ("starting", "ready", "sleeping", "draining", "unloaded")

SECRET_HEADER = "x-hydrant-worker-secret"  # noqa: S105  # a header name, not a secret
FRAME_MEDIA_TYPE = "application/x-hydrant-frames"
MSGPACK_MEDIA_TYPE = "application/msgpack"

ErrorKind = Literal["invalid", "unavailable", "failed"]
# What serves behind a record: a Hydrant worker, or an upstream OpenAI-compatible server
# (vLLM, SGLang, another Hydrant) that a gateway health-checks and registers for it.
MemberKind = Literal["hydrant", "openai"]


class WorkerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A worker as the registry knows it; rewritten at every heartbeat."""

    worker_id: str
    model: str
    address: str
    device: str
    state: WorkerState
    path: str
    quantization: str | None = None
    kind: MemberKind = "hydrant"
    pid: int = 0
    capacity: int = 1
    max_model_len: int = 0
    inflight: int = 0
    idle_since: float | None = None  # wall clock of its last request's end (every gateway's)
    stats: EngineStats | None = None
    started_at: float = 0.0
    heartbeat_at: float = 0.0
    # Wall clock of its last state change (0: a worker from before this field). Every
    # reader sees the same stamp, so cost timelines key intervals by it (reconciliation).
    state_since: float = 0.0

    @property
    def revision(self) -> tuple[str, str | None]:
        """What a hot swap replaces: the checkpoint and its quantization."""
        return (self.path, self.quantization)


class StreamError(msgspec.Struct, frozen=True, kw_only=True):
    """Why a stream ended without a finished chunk.

    `unavailable` means the worker gave the request back (draining, asleep,
    shut down) and it may run elsewhere if no token was produced; `invalid`
    is the caller's fault; `failed` is the engine's.
    """

    kind: ErrorKind
    message: str
    param: str | None = None


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """One request's part of a frame: its new chunk, or the error that ends it."""

    request_id: str
    chunk: GenerateChunk | None = None
    error: StreamError | None = None


class Frame(msgspec.Struct, frozen=True, kw_only=True):
    """What one engine step produced for one gateway's requests on the worker."""

    entries: list[Entry] = []


class LinkOpening(msgspec.Struct, frozen=True, array_like=True):
    """`POST /steps`: the link's id, made afresh by the gateway for each connection."""

    link_id: str


class Admission(msgspec.Struct, frozen=True, array_like=True):
    """`POST /admit`: start the request; its output comes on the link."""

    link_id: str
    request: GenerateRequest


class Cancellation(msgspec.Struct, frozen=True, array_like=True):
    """`POST /cancel`: the gateway gave up on one of its link's requests."""

    link_id: str
    request_id: str


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    """The body of a worker's non-2xx answer."""

    error: StreamError


_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 * 1024 * 1024
_encoder = msgspec.msgpack.Encoder()
_frame_decoder = msgspec.msgpack.Decoder(Frame)


def encode_frame(frame: Frame) -> bytes:
    payload = _encoder.encode(frame)
    return _HEADER.pack(len(payload)) + payload


KEEPALIVE_FRAME = encode_frame(Frame())  # no entries: only says the link is alive


class FrameError(ValueError):
    """A malformed or oversized frame: the stream cannot be trusted past this point."""


class FrameReader:
    """Reassembles frames from the byte pieces an HTTP client hands out."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[Frame]:
        self._buffer.extend(data)
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > MAX_FRAME_BYTES:
                raise FrameError(f"frame of {size} bytes exceeds the limit")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                return
            payload = bytes(self._buffer[_HEADER.size : end])
            del self._buffer[:end]
            try:
                yield _frame_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                raise FrameError(f"undecodable frame: {exc}") from exc

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame (non-zero at the end of a stream = truncated)."""
        return len(self._buffer)


def secret_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing does not reveal the secret's prefix."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


# ---- registry keys: one record key per worker (with a TTL), one sorted set per model ----


def record_key(prefix: str, worker_id: str) -> str:
    return f"{prefix}:worker:{worker_id}"


def pool_key(prefix: str, model: str) -> str:
    """Sorted set of the model's worker ids, scored by their record's expiry (ms)."""
    return f"{prefix}:pool:{model}"


def models_key(prefix: str) -> str:
    return f"{prefix}:models"


record_encoder = msgspec.json.Encoder()
record_decoder = msgspec.json.Decoder(WorkerRecord)
