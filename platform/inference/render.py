"""Engine chunks → OpenAI response bodies and server-sent events.

One accumulator per request builds the non-streamed body from the same
chunks the streamed path forwards, so both report identical text and usage.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec

from hydrant.engine.protocol import ChoiceDelta, RequestUsage, TokenLogprob
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.service import Generation

_encoder = msgspec.json.Encoder()


def usage_body(usage: RequestUsage) -> s.Usage:
    return s.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=s.PromptTokensDetails(cached_tokens=usage.cached_tokens),
    )


def _token(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and UTF-8 bytes for logprobs: the bytes are the token's own (a piece of a
    character split across tokens stays rebuildable), the text is them decoded (U+FFFD for a
    piece)."""
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> s.ChatLogprobs:
    content = []
    for entry in entries:
        text, raw = _token(tokenizer, entry.token_id)
        top = []
        for token_id, logprob in entry.top:
            top_text, top_raw = _token(tokenizer, token_id)
            top.append(s.TopLogprob(token=top_text, logprob=logprob, bytes=top_raw))
        content.append(
            s.ChatTokenLogprob(token=text, logprob=entry.logprob, bytes=raw, top_logprobs=top)
        )
    return s.ChatLogprobs(content=content)


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class Accumulator:
    """Collects the chunks of a request into per-choice text, logprobs and finish reasons."""

    def __init__(self, n: int) -> None:
        self.choices = [_Choice() for _ in range(n)]

    def add(self, delta: ChoiceDelta) -> None:
        choice = self.choices[delta.index]
        choice.text.append(delta.text)
        if delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason


def _finish(reason: str | None) -> str | None:
    # OpenAI knows stop / length; an abort or engine error is reported as such.
    return reason


async def collect(generation: Generation) -> Accumulator:
    accumulator = Accumulator(generation.ctx.prepared.sampling.n)
    async for chunk in generation:
        for delta in chunk.choices:
            accumulator.add(delta)
    return accumulator


async def chat_completion(generation: Generation, tokenizer: Tokenizer) -> s.ChatCompletion:
    acc = await collect(generation)
    want_logprobs = generation.ctx.prepared.sampling.logprobs is not None
    return s.ChatCompletion(
        id=f"chatcmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.model,
        choices=[
            s.ChatChoice(
                index=i,
                message=s.AssistantMessage(content="".join(c.text)),
                logprobs=chat_logprobs(tokenizer, c.logprobs) if want_logprobs else None,
                finish_reason=_finish(c.finish_reason),
            )
            for i, c in enumerate(acc.choices)
        ],
        usage=usage_body(generation.usage()),
    )


def completion_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> s.CompletionLogprobs:
    tokens, offsets, top = [], [], []
    offset = 0
    for entry in entries:
        text, _ = _token(tokenizer, entry.token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        top.append({_token(tokenizer, tid)[0]: lp for tid, lp in entry.top})
    return s.CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=top,
        text_offset=offsets,
    )


async def text_completion(generation: Generation, tokenizer: Tokenizer) -> s.Completion:
    acc = await collect(generation)
    prepared = generation.ctx.prepared
    prefix = prepared.echo_text or ""
    return s.Completion(
        id=f"cmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.model,
        choices=[
            s.CompletionChoice(
                index=i,
                text=prefix + "".join(c.text),
                logprobs=completion_logprobs(tokenizer, c.logprobs)
                if prepared.sampling.logprobs is not None
                else None,
                finish_reason=_finish(c.finish_reason),
            )
            for i, c in enumerate(acc.choices)
        ],
        usage=usage_body(generation.usage()),
    )


# Characters JSON may carry raw inside strings but that line splitters other than the SSE
# spec's treat as line ends (Python's str.splitlines, hence httpx's iter_lines; JavaScript
# before ES2019 for U+2028/9): written escaped, an event is one line for every client.
# In UTF-8 these byte runs can only be these characters, so the swap cannot touch others.
_LINE_BREAKERS = (
    (b"\xc2\x85", b"\\u0085"),
    (b"\xe2\x80\xa8", b"\\u2028"),
    (b"\xe2\x80\xa9", b"\\u2029"),
)


def sse(payload: object) -> bytes:
    """One SSE event: `data: <JSON>` on a single line, whatever text the tokens decode to."""
    data = _encoder.encode(payload)
    for raw, escaped in _LINE_BREAKERS:
        if raw in data:
            data = data.replace(raw, escaped)
    return b"data: " + data + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def _events(
    generation: Generation,
    first_event: Callable[[int], object] | None,
    delta_event: Callable[[ChoiceDelta], object],
    usage_event: Callable[[RequestUsage], object],
    error_event: Callable[[str], object],
) -> AsyncIterator[bytes]:
    n = generation.ctx.prepared.sampling.n
    if first_event is not None:
        for index in range(n):
            yield sse(first_event(index))
    try:
        async for chunk in generation:
            for delta in chunk.choices:
                if delta.text or delta.finish_reason or delta.logprobs:
                    yield sse(delta_event(delta))
            if chunk.error:
                yield sse(error_event(chunk.error))
    except Exception:  # the engine or worker failed mid-stream: end with an error event
        yield sse(error_event("the model failed while generating; the response is incomplete"))
        yield DONE
        return
    if generation.ctx.prepared.include_usage:
        yield sse(usage_event(generation.usage()))
    yield DONE


def chat_stream(generation: Generation, tokenizer: Tokenizer) -> AsyncIterator[bytes]:
    ctx = generation.ctx
    rid, created, want_logprobs = f"chatcmpl-{ctx.request_id}", int(time.time()), False
    want_logprobs = ctx.prepared.sampling.logprobs is not None

    def chunk(choices: list[s.ChatChunkChoice], usage: s.Usage | None = None) -> object:
        return s.ChatCompletionChunk(
            id=rid, created=created, model=ctx.model, choices=choices, usage=usage
        )

    return _events(
        generation,
        lambda i: chunk(
            [
                s.ChatChunkChoice(
                    index=i,
                    delta=s.ChatDelta(role="assistant", content=""),
                    logprobs=None,
                    finish_reason=None,
                )
            ]
        ),
        lambda d: chunk(
            [
                s.ChatChunkChoice(
                    index=d.index,
                    delta=s.ChatDelta(content=d.text) if d.text else s.ChatDelta(),
                    logprobs=chat_logprobs(tokenizer, d.logprobs or []) if want_logprobs else None,
                    finish_reason=_finish(d.finish_reason),
                )
            ]
        ),
        lambda u: chunk([], usage_body(u)),
        lambda message: {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
        },
    )


def completion_stream(generation: Generation, tokenizer: Tokenizer) -> AsyncIterator[bytes]:
    ctx = generation.ctx
    rid, created = f"cmpl-{ctx.request_id}", int(time.time())
    want_logprobs = ctx.prepared.sampling.logprobs is not None

    def chunk(choices: list[s.CompletionChoice], usage: s.Usage | None = None) -> object:
        return s.Completion(id=rid, created=created, model=ctx.model, choices=choices, usage=usage)

    echo = ctx.prepared.echo_text
    first = (
        (
            lambda i: chunk(
                [s.CompletionChoice(index=i, text=echo, logprobs=None, finish_reason=None)]
            )
        )
        if echo
        else None
    )
    return _events(
        generation,
        first,
        lambda d: chunk(
            [
                s.CompletionChoice(
                    index=d.index,
                    text=d.text,
                    logprobs=completion_logprobs(tokenizer, d.logprobs or [])
                    if want_logprobs
                    else None,
                    finish_reason=_finish(d.finish_reason),
                )
            ]
        ),
        lambda u: chunk([], usage_body(u)),
        lambda message: {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
        },
    )
