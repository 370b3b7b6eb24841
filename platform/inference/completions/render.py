"""Legacy completions as OpenAI returns them: whole, or as `text_completion` events, with
the legacy logprobs (text offsets included) and an echoed, scored prompt."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from hydrant.engine.detokenizer import IncrementalDetokenizer
from hydrant.engine.protocol import ChoiceDelta, GenerateChunk, TokenLogprob
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.dispatch.upstream_wire import TOKEN_ID_PREFIX  # the form upstreams read
from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.render import (
    ChunkTemplate,
    collect,
    events,
    stream_error,
    token_piece,
    usage_body,
)
from hydrant.platform.inference.service import Generation


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


def _name(tokenizer: Tokenizer, token_id: int, as_ids: bool) -> str:
    return f"{TOKEN_ID_PREFIX}{token_id}" if as_ids else token_piece(tokenizer, token_id)[0]


def completion_logprobs(
    tokenizer: Tokenizer,
    entries: list[TokenLogprob],
    context: list[int],
    prompt: list[TokenLogprob | None] | None = None,
    offsets: list[int] | None = None,
    as_ids: bool = False,
) -> s.CompletionLogprobs:
    """Legacy logprobs of a choice's tokens, which follow `context` (the prompt). With
    `prompt` (echo), the prompt's own tokens lead, the first one without a score. `offsets`
    of `entries` are given by a stream, which knows the text already sent. `as_ids`: tokens
    named `token_id:N` (vLLM's `return_tokens_as_token_ids`: exact where a piece of a
    character would be U+FFFD)."""
    tokens: list[str] = []
    scores: list[float | None] = []
    top: list[dict[str, float] | None] = []
    text_offset: list[int] = []
    base = 0
    if prompt is not None:
        for token_id, entry in zip(context, prompt, strict=False):
            tokens.append(_name(tokenizer, token_id, as_ids))
            scores.append(None if entry is None else entry.logprob)
            top.append(None if entry is None else _top(tokenizer, entry, as_ids))
        text_offset = _Offsets(tokenizer, [], 0).of(context[: len(tokens)])
        base = len(tokenizer.decode(context))
    for entry in entries:
        tokens.append(_name(tokenizer, entry.token_id, as_ids))
        scores.append(entry.logprob)
        top.append(_top(tokenizer, entry, as_ids))
    if offsets is None:
        offsets = _Offsets(tokenizer, context, base).of([e.token_id for e in entries])
    return s.CompletionLogprobs(
        tokens=tokens, token_logprobs=scores, top_logprobs=top, text_offset=text_offset + offsets
    )


def _top(tokenizer: Tokenizer, entry: TokenLogprob, as_ids: bool) -> dict[str, float]:
    return {_name(tokenizer, token_id, as_ids): logprob for token_id, logprob in entry.top}


def _asks(generation: Generation, name: str) -> bool:
    return bool((generation.ctx.prepared.response_fields or {}).get(name))


async def text_completion(generation: Generation, tokenizer: Tokenizer) -> s.Completion:
    acc = await collect(generation)
    prepared = generation.ctx.prepared
    n = prepared.settings.n
    with_ids, as_ids = _asks(generation, "return_token_ids"), _asks(generation, "tokens_as_ids")

    def logprobs() -> list[s.CompletionLogprobs | None]:
        if prepared.settings.logprobs is None:
            return [None] * len(acc.choices)
        return [
            completion_logprobs(
                tokenizer,
                c.logprobs,
                prepared.prompts[i // n].token_ids,
                acc.prompt_logprobs[i // n],
                as_ids=as_ids,
            )
            for i, c in enumerate(acc.choices)
        ]

    # A scored prompt (echo) is up to 8192 tokens to render, about 0.1 s: off the event loop.
    scored = any(p is not None for p in acc.prompt_logprobs)
    rendered = await asyncio.to_thread(logprobs) if scored else logprobs()
    return s.Completion(
        id=f"cmpl-{generation.ctx.request_id}",
        created=int(time.time()),
        model=generation.ctx.public_model,
        choices=[
            s.CompletionChoice(
                index=i,
                text=(prepared.prompts[i // n].echo_text or "") + "".join(c.text),
                logprobs=rendered[i],
                finish_reason=c.finish_reason,
                prompt_token_ids=list(prepared.prompts[i // n].token_ids) if with_ids else None,
                token_ids=c.token_ids if with_ids else None,
            )
            for i, c in enumerate(acc.choices)
        ],
        usage=usage_body(generation.usage()),
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
    with_ids, as_ids = _asks(generation, "return_token_ids"), _asks(generation, "tokens_as_ids")
    started: set[int] = set()  # choices whose first chunk went (it carries the prompt's ids)

    def prompt_ids(index: int) -> list[int] | None:
        if not with_ids or index in started:
            return None
        started.add(index)
        return list(prepared.prompts[index // n].token_ids)

    template = ChunkTemplate(
        s.Completion(id=rid, created=created, model=ctx.public_model, choices=[])
    )
    chunk = template.event

    echo_logprobs: dict[int, s.CompletionLogprobs] = {}  # per prompt, rendered once for its n

    def echo_event(index: int, first: GenerateChunk | None) -> bytes:
        prompt = prepared.prompts[index // n]
        logprobs = None
        if scored:
            if index // n not in echo_logprobs:
                scores = (first.prompt_logprobs if first is not None else None) or []
                echo_logprobs[index // n] = completion_logprobs(
                    tokenizer, [], prompt.token_ids, scores, as_ids=as_ids
                )
            logprobs = echo_logprobs[index // n]
        return chunk(
            [
                s.CompletionChoice(
                    index=index,
                    text=prompt.echo_text or "",
                    logprobs=logprobs,
                    finish_reason=None,
                    prompt_token_ids=prompt_ids(index),
                    token_ids=[] if with_ids else None,
                )
            ]
        )

    def delta_event(index: int, d: ChoiceDelta) -> bytes:
        logprobs = None
        if want_logprobs:
            prompt = prepared.prompts[index // n]
            entries = d.logprobs or []
            if index not in offsets:
                offsets[index] = _Offsets(tokenizer, prompt.token_ids, len(prompt.echo_text or ""))
            at = offsets[index].of([e.token_id for e in entries])
            logprobs = completion_logprobs(tokenizer, entries, prompt.token_ids, None, at, as_ids)
        return chunk(
            [
                s.CompletionChoice(
                    index=index,
                    text=d.text,
                    logprobs=logprobs,
                    finish_reason=d.finish_reason,
                    prompt_token_ids=prompt_ids(index),
                    token_ids=list(d.token_ids) if with_ids else None,
                )
            ]
        )

    return events(
        generation,
        echo_event if echoed else None,
        delta_event,
        lambda u: chunk([], usage_body(u)),
        stream_error,
        first_after_prefill=scored,
    )
