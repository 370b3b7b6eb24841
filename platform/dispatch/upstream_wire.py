"""The OpenAI completions wire of an upstream pool member, in the protocol's terms.

Pure functions, no I/O: `completion_body` turns a `GenerateRequest` (the
gateway's token ids and sampling) into a streamed `/v1/completions` body,
`SseLines` splits the response into events, and `chunk_of`/`usage_of` read
each event back as the protocol's `GenerateChunk`/`RequestUsage`.

The prompt goes as token ids, so the upstream runs exactly the tokens the
gateway counted for tiers, quotas and prices, and chat requests take the same
path (the gateway applied the chat template). `return_token_ids` (vLLM) gives
each delta's token ids, so the gateway counts completion tokens itself and
can check the upstream's `usage` against its own count.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import (
    ChoiceDelta,
    FinishReason,
    GenerateChunk,
    GenerateRequest,
    RequestUsage,
    TokenLogprob,
)

TOKEN_ID_PREFIX = "token_id:"  # noqa: S105  # vLLM's `return_tokens_as_token_ids` form of a logprob's token
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class UpstreamChoice(msgspec.Struct, kw_only=True):
    index: int = 0
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int | None = None


class UpstreamUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None


class UpstreamError(msgspec.Struct, kw_only=True):
    message: str = ""
    param: str | None = None


class UpstreamEvent(msgspec.Struct, kw_only=True):
    """One streamed `text_completion` chunk (only the fields the gateway reads); `error`: the
    upstream failed mid-stream."""

    choices: list[UpstreamChoice] = msgspec.field(default_factory=list)
    usage: UpstreamUsage | None = None
    error: UpstreamError | None = None


class UpstreamErrorBody(msgspec.Struct, kw_only=True):
    error: UpstreamError | None = None
    message: str | None = None  # some servers answer `{"message": ...}` or `{"detail": ...}`
    detail: Any = None


event_decoder = msgspec.json.Decoder(UpstreamEvent)
_error_decoder = msgspec.json.Decoder(UpstreamErrorBody)


def _unsupported(what: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(f"{what} is not supported by this model's upstream pool", param)


def _structured_outputs(kind: str, spec: str) -> dict[str, Any]:
    """The engine's constraint `(kind, spec)` as vLLM's `structured_outputs`."""
    if kind in ("json", "choice"):
        return {kind: json.loads(spec)}
    return {kind: spec}


def completion_body(request: GenerateRequest, model: str) -> dict[str, Any]:
    """The `/v1/completions` body that runs `request` upstream (streamed, with usage)."""
    s = request.sampling
    if s.embed:
        raise _unsupported("Embeddings", "input")
    if request.adapter is not None:
        raise _unsupported("A LoRA adapter", "model")
    if s.prompt_logprobs is not None:
        raise _unsupported("prompt_logprobs", "prompt_logprobs")
    if s.structured_output_after is not None:
        raise _unsupported("A constraint after reasoning", "response_format")
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(request.prompt_token_ids),
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "n": s.n,
        "max_tokens": s.max_tokens,
        "min_tokens": s.min_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else -1,
        "min_p": s.min_p,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "ignore_eos": s.ignore_eos,
        "include_stop_str_in_output": s.include_stop_str_in_output,
        # The ids are the gateway's own tokens: no BOS (or other special token) added twice.
        "add_special_tokens": False,
    }
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    if s.stop_token_ids:
        body["stop_token_ids"] = list(s.stop_token_ids)
    if s.logprobs is not None:
        body["logprobs"] = s.logprobs
        body["return_tokens_as_token_ids"] = True
    if s.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in s.logit_bias}
    if s.structured_output is not None:
        body["structured_outputs"] = _structured_outputs(*s.structured_output)
    return body


def _token_id(token: str) -> int:
    if not token.startswith(TOKEN_ID_PREFIX):
        raise ValueError(f"logprob token {token!r} is not in the token-id form")
    return int(token[len(TOKEN_ID_PREFIX) :])


def logprobs_of(raw: dict[str, Any], token_ids: list[int]) -> list[TokenLogprob]:
    """The completions API's `logprobs` (tokens as `token_id:N`) as the protocol's entries."""
    tokens = raw.get("tokens") or []
    values = raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or [None] * len(tokens)
    out = []
    for position, (token, value, top) in enumerate(zip(tokens, values, tops, strict=False)):
        token_id = token_ids[position] if position < len(token_ids) else _token_id(token)
        ranked = sorted(
            ((_token_id(t), float(v)) for t, v in (top or {}).items()), key=lambda pair: -pair[1]
        )
        out.append(TokenLogprob(token_id, float(value if value is not None else 0.0), ranked))
    return out


def chunk_of(request_id: str, event: UpstreamEvent) -> GenerateChunk | None:
    """An event's choices as a chunk; None when it carries nothing (no text, ids or end)."""
    deltas = []
    for choice in event.choices:
        ids = list(choice.token_ids or ())
        reason = _FINISH.get(choice.finish_reason or "", "stop") if choice.finish_reason else None
        if not choice.text and not ids and reason is None:
            continue
        deltas.append(
            ChoiceDelta(
                index=choice.index,
                token_ids=ids,
                text=choice.text,
                finish_reason=reason,
                logprobs=logprobs_of(choice.logprobs, ids) if choice.logprobs else None,
            )
        )
    return GenerateChunk(request_id=request_id, choices=deltas) if deltas else None


def usage_of(usage: UpstreamUsage, device_ns: int, e2e_seconds: float) -> RequestUsage:
    details = usage.prompt_tokens_details
    return RequestUsage(
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        completion_tokens=usage.completion_tokens,
        device_ns=device_ns,
        e2e_seconds=e2e_seconds,
    )


def error_message(body: bytes) -> tuple[str, str | None]:
    """The message (and param) of an upstream's error answer, whatever its shape."""
    try:
        decoded = _error_decoder.decode(body)
    except msgspec.DecodeError:
        return body[:200].decode("utf-8", errors="replace"), None
    if decoded.error is not None:
        return decoded.error.message, decoded.error.param
    return str(decoded.message or decoded.detail or ""), None


class SseLines:
    """Splits a byte stream into SSE `data:` payloads (`None` for `[DONE]`).

    One `split` per read, not a search and a copy of the buffer per line: a read
    usually holds whole events, one or a few."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes | None]:
        if self._buffer:
            data = self._buffer + data
        lines = data.split(b"\n")
        self._buffer = lines.pop()  # what follows the last line end: an unfinished line
        payloads: list[bytes | None] = []
        for line in lines:
            if line.startswith(b"data:"):  # not blank separators, comments, `event:` lines
                payload = line[5:].strip()  # the optional space, and a CR of a CRLF
                payloads.append(None if payload == b"[DONE]" else payload)
        return payloads
