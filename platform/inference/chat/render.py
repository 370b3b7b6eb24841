"""Chat completions as OpenAI returns them: whole, or as `chat.completion.chunk` events.

With tools or a thinking model, a choice's text is read for reasoning,
content and tool calls (answer.py) before it is sent, whole or streamed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from hydrant.engine.protocol import ChoiceDelta, TokenLogprob
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference import schemas as s
from hydrant.platform.inference.chat.answer import AnswerReader, read_whole
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.inference.render import (
    Choice,
    ChunkTemplate,
    collect,
    events,
    stream_error,
    thinking_tokens,
    token_piece,
    usage_body,
)
from hydrant.platform.inference.service import Generation


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


def _message(prepared: PreparedRequest, choice: Choice) -> tuple[s.AssistantMessage, str | None]:
    """A choice's message and finish reason: its text, or with tools or a thinking model
    what the text holds (reasoning, content, calls)."""
    text = "".join(choice.text)
    if prepared.tools is None and prepared.thinking is None:
        return s.AssistantMessage(role="assistant", content=text), choice.finish_reason
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
    return message, answer.finish_reason


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
        model=generation.ctx.public_model,
        choices=choices,
        usage=usage_body(
            generation.usage(),
            thinking_tokens(tokenizer, generation.ctx.prepared, (c.token_ids for c in acc.choices)),
        ),
    )


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

    template = ChunkTemplate(
        s.ChatCompletionChunk(id=rid, created=created, model=ctx.public_model, choices=[])
    )
    chunk = template.event

    def delta_event(i: int, d: ChoiceDelta) -> bytes | None:
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
                    finish_reason=reason,
                )
            ]
        )

    return events(
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
        stream_error,
        outputs=outputs,
    )
