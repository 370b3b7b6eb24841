"""Engine chunks → OpenAI response bodies and server-sent events.

One accumulator per request builds the non-streamed body from the same
chunks the streamed path forwards, so both report identical text and usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import msgspec

from hydrant.engine.detokenizer import IncrementalDetokenizer
from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, RequestUsage, TokenLogprob
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
        self.prompt_logprobs: list[TokenLogprob | None] | None = None

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
        if chunk.prompt_logprobs is not None:
            accumulator.prompt_logprobs = chunk.prompt_logprobs
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


class _Offsets:
    """Where each token's text starts in the response text: the length of the text before it,
    detokenized as the engine does (a token holding the start of a character split across
    tokens starts where that character does; a skipped special token takes no room). A
    stream keeps one per choice, so the text a chunk held back still counts."""

    def __init__(self, tokenizer: Tokenizer, context: list[int], at: int) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, context)
        self._at = at

    def of(self, ids: list[int]) -> list[int]:
        offsets = []
        for token_id in ids:
            offsets.append(self._at)
            self._at += len(self._detokenizer.add(token_id))
        return offsets


def completion_logprobs(
    tokenizer: Tokenizer,
    entries: list[TokenLogprob],
    context: list[int],
    prompt: list[TokenLogprob | None] | None = None,
    offsets: list[int] | None = None,
) -> s.CompletionLogprobs:
    """Legacy logprobs of a choice's tokens, which follow `context` (the prompt). With
    `prompt` (echo), the prompt's own tokens lead, the first one without a score. `offsets`
    of `entries` are given by a stream, which knows the text already sent."""
    tokens: list[str] = []
    scores: list[float | None] = []
    top: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    base = 0
    if prompt is not None:
        for token_id, entry in zip(context, prompt, strict=False):
            tokens.append(_token(tokenizer, token_id)[0])
            scores.append(None if entry is None else entry.logprob)
            top.append(None if entry is None else _top(tokenizer, entry))
        text_offset = _Offsets(tokenizer, [], 0).of(context[: len(tokens)])
        base = len(tokenizer.decode(context))
    for entry in entries:
        tokens.append(_token(tokenizer, entry.token_id)[0])
        scores.append(entry.logprob)
        top.append(_top(tokenizer, entry))
    if offsets is None:
        offsets = _Offsets(tokenizer, context, base).of([e.token_id for e in entries])
    return s.CompletionLogprobs(
        tokens=tokens, token_logprobs=scores, top_logprobs=top, text_offset=text_offset + offsets
    )


def _top(tokenizer: Tokenizer, entry: TokenLogprob) -> dict[str, float]:
    return {_token(tokenizer, token_id)[0]: logprob for token_id, logprob in entry.top}


async def text_completion(generation: Generation, tokenizer: Tokenizer) -> s.Completion:
    acc = await collect(generation)
    prepared = generation.ctx.prepared
    prefix = prepared.echo_text or ""

    def logprobs() -> list[s.CompletionLogprobs | None]:
        if prepared.sampling.logprobs is None:
            return [None] * len(acc.choices)
        ids = prepared.prompt_token_ids
        return [
            completion_logprobs(tokenizer, c.logprobs, ids, acc.prompt_logprobs)
            for c in acc.choices
        ]

    # A scored prompt (echo) is up to 8192 tokens to render, about 0.1 s: off the event loop.
    rendered = await asyncio.to_thread(logprobs) if acc.prompt_logprobs else logprobs()
    return s.Completion(
        id=f"cmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.model,
        choices=[
            s.CompletionChoice(
                index=i,
                text=prefix + "".join(c.text),
                logprobs=rendered[i],
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
    first_event: Callable[[int, GenerateChunk | None], object] | None,
    delta_event: Callable[[ChoiceDelta], object],
    usage_event: Callable[[RequestUsage], object],
    error_event: Callable[[str], object],
    *,
    first_after_prefill: bool = False,
) -> AsyncIterator[bytes]:
    """The SSE events of a generation. The first events (one per choice) go out at once, or
    with `first_after_prefill` along with the first chunk (an echo that carries the prompt's
    logprobs, which exist once the prompt is computed)."""
    n = generation.ctx.prepared.sampling.n
    if first_event is not None and not first_after_prefill:
        for index in range(n):
            yield sse(first_event(index, None))
        first_event = None
    try:
        async for chunk in generation:
            if first_event is not None:  # a scored prompt to render: off the event loop
                for index in range(n):
                    yield sse(await asyncio.to_thread(first_event, index, chunk))
                first_event = None
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
        lambda i, _: chunk(
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
    prepared = ctx.prepared
    want_logprobs = prepared.sampling.logprobs is not None
    scored = prepared.sampling.prompt_logprobs is not None  # echo with logprobs
    prompt_ids = prepared.prompt_token_ids
    echo = prepared.echo_text
    offsets: dict[int, _Offsets] = {}  # per choice, over the tokens streamed so far

    def chunk(choices: list[s.CompletionChoice], usage: s.Usage | None = None) -> object:
        return s.Completion(id=rid, created=created, model=ctx.model, choices=choices, usage=usage)

    echo_logprobs: list[s.CompletionLogprobs] = []  # rendered once for the n choices

    def echo_event(index: int, first: GenerateChunk | None) -> object:
        logprobs = None
        if scored:
            if not echo_logprobs:
                scores = (first.prompt_logprobs if first is not None else None) or []
                echo_logprobs.append(completion_logprobs(tokenizer, [], prompt_ids, scores))
            logprobs = echo_logprobs[0]
        return chunk(
            [
                s.CompletionChoice(
                    index=index, text=echo or "", logprobs=logprobs, finish_reason=None
                )
            ]
        )

    def delta_event(d: ChoiceDelta) -> object:
        logprobs = None
        if want_logprobs:
            entries = d.logprobs or []
            if d.index not in offsets:
                offsets[d.index] = _Offsets(tokenizer, prompt_ids, len(echo or ""))
            at = offsets[d.index].of([e.token_id for e in entries])
            logprobs = completion_logprobs(tokenizer, entries, prompt_ids, None, at)
        return chunk(
            [
                s.CompletionChoice(
                    index=d.index,
                    text=d.text,
                    logprobs=logprobs,
                    finish_reason=_finish(d.finish_reason),
                )
            ]
        )

    return _events(
        generation,
        echo_event if echo else None,
        delta_event,
        lambda u: chunk([], usage_body(u)),
        lambda message: {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
        },
        first_after_prefill=scored,
    )
