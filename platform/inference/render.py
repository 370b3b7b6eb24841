"""Engine chunks → OpenAI response bodies and server-sent events.

One accumulator per request builds the non-streamed body from the same
chunks the streamed path forwards, so both report identical text and usage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from hydrant.engine.detokenizer import IncrementalDetokenizer
from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, RequestUsage, TokenLogprob
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.answer import AnswerReader, read_whole
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.inference.reasoning import reasoning_tokens
from hydrant.platform.inference.service import Generation

_encoder = msgspec.json.Encoder()


def usage_body(usage: RequestUsage, reasoning: int | None = None) -> s.Usage:
    """`reasoning`: the thinking tokens of a model that thinks (None: it does not)."""
    return s.Usage(
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
        prompt_tokens_details=s.PromptTokensDetails(cached_tokens=usage.cached_tokens),
        completion_tokens_details=(
            None if reasoning is None else s.CompletionTokensDetails(reasoning_tokens=reasoning)
        ),
    )


def thinking_tokens(
    tokenizer: Tokenizer, prepared: PreparedRequest, outputs: Iterable[Sequence[int]]
) -> int | None:
    """The thinking tokens of all of a request's choices (None: the model does not think)."""
    if prepared.thinking is None:
        return None
    return sum(reasoning_tokens(tokenizer, ids, prepared.thinking) for ids in outputs)


def token_piece(tokenizer: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    """A token's text and UTF-8 bytes for logprobs: the bytes are the token's own (a piece of a
    character split across tokens stays rebuildable), the text is them decoded (U+FFFD for a
    piece)."""
    raw = tokenizer.token_bytes(token_id)
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tokenizer: Tokenizer, entries: list[TokenLogprob]) -> s.ChatLogprobs:
    content = []
    for entry in entries:
        text, raw = token_piece(tokenizer, entry.token_id)
        top = []
        for token_id, logprob in entry.top:
            top_text, top_raw = token_piece(tokenizer, token_id)
            top.append(s.TopLogprob(token=top_text, logprob=logprob, bytes=top_raw))
        content.append(
            s.ChatTokenLogprob(token=text, logprob=entry.logprob, bytes=raw, top_logprobs=top)
        )
    return s.ChatLogprobs(content=content)


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None


class Accumulator:
    """Collects the chunks of a request into per-choice text, logprobs and finish reasons.
    Choice `i` of prompt `p` is choice `p * n + i` of the response (a batched completion)."""

    def __init__(self, prompts: int, n: int) -> None:
        self.n = n
        self.choices = [_Choice() for _ in range(prompts * n)]
        self.prompt_logprobs: list[list[TokenLogprob | None] | None] = [None] * prompts

    def add(self, prompt: int, delta: ChoiceDelta) -> None:
        choice = self.choices[prompt * self.n + delta.index]
        choice.text.append(delta.text)
        choice.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason


def _finish(reason: str | None) -> str | None:
    # OpenAI knows stop / length; an abort or engine error is reported as such.
    return reason


async def collect(generation: Generation) -> Accumulator:
    prepared = generation.ctx.prepared
    accumulator = Accumulator(len(prepared.prompts), prepared.settings.n)
    async for prompt, chunk in generation:
        if chunk.prompt_logprobs is not None:
            accumulator.prompt_logprobs[prompt] = chunk.prompt_logprobs
        for delta in chunk.choices:
            accumulator.add(prompt, delta)
    return accumulator


def _message(prepared: PreparedRequest, choice: _Choice) -> tuple[s.AssistantMessage, str | None]:
    """A choice's message and finish reason: its text, or with tools or a thinking model
    what the text holds (reasoning, content, calls)."""
    text = "".join(choice.text)
    if prepared.tools is None and prepared.thinking is None:
        return s.AssistantMessage(role="assistant", content=text), _finish(choice.finish_reason)
    answer = read_whole(text, choice.finish_reason, prepared.tools, prepared.thinking)
    message = s.AssistantMessage(
        role="assistant",
        # null when the answer is only calls or only thinking (cut short), as vLLM answers
        content=answer.content or (None if answer.calls or answer.reasoning else ""),
        reasoning_content=answer.reasoning or None,
        tool_calls=[
            s.ToolCall(id=c.id, function=s.FunctionCall(name=c.name, arguments=c.arguments))
            for c in answer.calls
        ]
        or None,
    )
    return message, _finish(answer.finish_reason)


async def chat_completion(generation: Generation, tokenizer: Tokenizer) -> s.ChatCompletion:
    acc = await collect(generation)
    want_logprobs = generation.ctx.prepared.settings.logprobs is not None
    choices = []
    for i, c in enumerate(acc.choices):
        message, reason = _message(generation.ctx.prepared, c)
        choices.append(
            s.ChatChoice(
                index=i,
                message=message,
                logprobs=chat_logprobs(tokenizer, c.logprobs) if want_logprobs else None,
                finish_reason=reason,
            )
        )
    return s.ChatCompletion(
        id=f"chatcmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.model,
        choices=choices,
        usage=usage_body(
            generation.usage(),
            thinking_tokens(tokenizer, generation.ctx.prepared, (c.token_ids for c in acc.choices)),
        ),
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
            tokens.append(token_piece(tokenizer, token_id)[0])
            scores.append(None if entry is None else entry.logprob)
            top.append(None if entry is None else _top(tokenizer, entry))
        text_offset = _Offsets(tokenizer, [], 0).of(context[: len(tokens)])
        base = len(tokenizer.decode(context))
    for entry in entries:
        tokens.append(token_piece(tokenizer, entry.token_id)[0])
        scores.append(entry.logprob)
        top.append(_top(tokenizer, entry))
    if offsets is None:
        offsets = _Offsets(tokenizer, context, base).of([e.token_id for e in entries])
    return s.CompletionLogprobs(
        tokens=tokens, token_logprobs=scores, top_logprobs=top, text_offset=text_offset + offsets
    )


def _top(tokenizer: Tokenizer, entry: TokenLogprob) -> dict[str, float]:
    return {token_piece(tokenizer, token_id)[0]: logprob for token_id, logprob in entry.top}


async def text_completion(generation: Generation, tokenizer: Tokenizer) -> s.Completion:
    acc = await collect(generation)
    prepared = generation.ctx.prepared
    n = prepared.settings.n

    def logprobs() -> list[s.CompletionLogprobs | None]:
        if prepared.settings.logprobs is None:
            return [None] * len(acc.choices)
        return [
            completion_logprobs(
                tokenizer,
                c.logprobs,
                prepared.prompts[i // n].token_ids,
                acc.prompt_logprobs[i // n],
            )
            for i, c in enumerate(acc.choices)
        ]

    # A scored prompt (echo) is up to 8192 tokens to render, about 0.1 s: off the event loop.
    scored = any(p is not None for p in acc.prompt_logprobs)
    rendered = await asyncio.to_thread(logprobs) if scored else logprobs()
    return s.Completion(
        id=f"cmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.model,
        choices=[
            s.CompletionChoice(
                index=i,
                text=(prepared.prompts[i // n].echo_text or "") + "".join(c.text),
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
    delta_event: Callable[[int, ChoiceDelta], object | None],
    usage_event: Callable[[RequestUsage], object],
    error_event: Callable[[str], object],
    *,
    first_after_prefill: bool = False,
    outputs: dict[int, list[int]] | None = None,
) -> AsyncIterator[bytes]:
    """The SSE events of a generation, each choice under its response index (`p * n + i` for
    choice `i` of prompt `p`). The first events (one per choice) go out at once, or with
    `first_after_prefill` along with the prompt's first chunk (an echo that carries the
    prompt's logprobs, which exist once the prompt is computed). `outputs`, when given,
    collects each choice's token ids, those of deltas with no text too."""
    prepared = generation.ctx.prepared
    n = prepared.settings.n
    if first_event is not None and not first_after_prefill:
        for index in range(prepared.choices):
            yield sse(first_event(index, None))
        first_event = None
    opened = [first_event is None] * len(prepared.prompts)  # its first events are out
    try:
        async for prompt, chunk in generation:
            if not opened[prompt] and first_event is not None:  # a scored prompt: off the loop
                for index in range(prompt * n, prompt * n + n):
                    yield sse(await asyncio.to_thread(first_event, index, chunk))
                opened[prompt] = True
            for delta in chunk.choices:
                if outputs is not None:
                    outputs.setdefault(prompt * n + delta.index, []).extend(delta.token_ids)
                if delta.text or delta.finish_reason or delta.logprobs:
                    event = delta_event(prompt * n + delta.index, delta)
                    if event is not None:  # None: nothing to send yet (text held back)
                        yield sse(event)
            if chunk.error:
                yield sse(error_event(chunk.error))
    except Exception:  # the engine or worker failed mid-stream: end with an error event
        yield sse(error_event("the model failed while generating; the response is incomplete"))
        yield DONE
        return
    if prepared.include_usage:
        yield sse(usage_event(generation.usage()))
    yield DONE


def _answer_delta(reader: AnswerReader, d: ChoiceDelta) -> s.ChatDelta | None:
    """The delta of one engine delta read for reasoning and tools: what the reader let
    out, and what it held back once the choice finishes (None: nothing to send yet)."""
    steps = [reader.feed(d.text)]
    if d.finish_reason:
        steps.append(reader.end())
    reasoning = "".join(step.reasoning for step in steps)
    content = "".join(step.content for step in steps)
    pieces = [piece for step in steps for piece in step.calls]
    if not reasoning and not content and not pieces:
        return None
    calls = [
        s.ToolCallDelta(
            index=p.index,
            id=p.id,
            type="function" if p.id is not None else None,
            function=s.FunctionDelta(name=p.name, arguments=p.arguments),
        )
        for p in pieces
    ]
    return s.ChatDelta(
        content=content or None, reasoning_content=reasoning or None, tool_calls=calls or None
    )


def chat_stream(generation: Generation, tokenizer: Tokenizer) -> AsyncIterator[bytes]:
    ctx = generation.ctx
    rid, created = f"chatcmpl-{ctx.request_id}", int(time.time())
    want_logprobs = ctx.prepared.settings.logprobs is not None
    prepared = ctx.prepared
    plain = prepared.tools is None and prepared.thinking is None
    readers: dict[int, AnswerReader] = {}  # per choice, unless plain
    outputs: dict[int, list[int]] | None = {} if prepared.thinking is not None else None

    def chunk(choices: list[s.ChatChunkChoice], usage: s.Usage | None = None) -> object:
        return s.ChatCompletionChunk(
            id=rid, created=created, model=ctx.model, choices=choices, usage=usage
        )

    def delta_event(i: int, d: ChoiceDelta) -> object | None:
        reason: str | None = d.finish_reason
        if plain:
            delta = s.ChatDelta(content=d.text) if d.text else s.ChatDelta()
        else:
            if i not in readers:
                readers[i] = AnswerReader(prepared.tools, prepared.thinking)
            reader = readers[i]
            found = _answer_delta(reader, d)
            if found is None and not reason and not (want_logprobs and d.logprobs):
                return None
            delta = found or s.ChatDelta()
            reason = reader.finish_reason(reason)
        return chunk(
            [
                s.ChatChunkChoice(
                    index=i,
                    delta=delta,
                    logprobs=chat_logprobs(tokenizer, d.logprobs or []) if want_logprobs else None,
                    finish_reason=_finish(reason),
                )
            ]
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
        delta_event,
        lambda u: chunk(
            [], usage_body(u, thinking_tokens(tokenizer, prepared, (outputs or {}).values()))
        ),
        lambda message: {
            "error": {
                "message": message,
                "type": "server_error",
                "param": None,
                "code": "generation_failed",
            }
        },
        outputs=outputs,
    )


def completion_stream(generation: Generation, tokenizer: Tokenizer) -> AsyncIterator[bytes]:
    ctx = generation.ctx
    rid, created = f"cmpl-{ctx.request_id}", int(time.time())
    prepared = ctx.prepared
    n = prepared.settings.n
    want_logprobs = prepared.settings.logprobs is not None
    scored = prepared.settings.prompt_logprobs is not None  # echo with logprobs
    echoed = prepared.prompts[0].echo_text is not None
    offsets: dict[int, _Offsets] = {}  # per choice, over the tokens streamed so far

    def chunk(choices: list[s.CompletionChoice], usage: s.Usage | None = None) -> object:
        return s.Completion(id=rid, created=created, model=ctx.model, choices=choices, usage=usage)

    echo_logprobs: dict[int, s.CompletionLogprobs] = {}  # per prompt, rendered once for its n

    def echo_event(index: int, first: GenerateChunk | None) -> object:
        prompt = prepared.prompts[index // n]
        logprobs = None
        if scored:
            if index // n not in echo_logprobs:
                scores = (first.prompt_logprobs if first is not None else None) or []
                echo_logprobs[index // n] = completion_logprobs(
                    tokenizer, [], prompt.token_ids, scores
                )
            logprobs = echo_logprobs[index // n]
        return chunk(
            [
                s.CompletionChoice(
                    index=index, text=prompt.echo_text or "", logprobs=logprobs, finish_reason=None
                )
            ]
        )

    def delta_event(index: int, d: ChoiceDelta) -> object:
        logprobs = None
        if want_logprobs:
            prompt = prepared.prompts[index // n]
            entries = d.logprobs or []
            if index not in offsets:
                offsets[index] = _Offsets(tokenizer, prompt.token_ids, len(prompt.echo_text or ""))
            at = offsets[index].of([e.token_id for e in entries])
            logprobs = completion_logprobs(tokenizer, entries, prompt.token_ids, None, at)
        return chunk(
            [
                s.CompletionChoice(
                    index=index,
                    text=d.text,
                    logprobs=logprobs,
                    finish_reason=_finish(d.finish_reason),
                )
            ]
        )

    return _events(
        generation,
        echo_event if echoed else None,
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
