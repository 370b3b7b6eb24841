"""A chat answer as a Responses API answer: output items, and the stream's events.

One `OutputBuilder` turns the answer's pieces (answer.py: reasoning, content, tool
calls) into output items as they come: a `reasoning` item, a `message` with one
`output_text` part, a `function_call` per call. A new kind of piece closes the open
item and opens the next. The stream sends each step as events (`output_item.added`,
`output_text.delta`, …, `output_item.done`); a whole response runs the same builder
and keeps only the items, so both give the same output.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from hydrant.engine.protocol import RequestUsage
from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference.chat.answer import AnswerReader, Piece
from hydrant.platform.inference.render import collect, sse, thinking_tokens
from hydrant.platform.inference.service import Generation


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def usage_object(usage: RequestUsage, reasoning: int | None) -> dict[str, Any]:
    """`reasoning`: the thinking tokens, part of `output_tokens` (None: it did not think)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning or 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


class OutputBuilder:
    """Output items built piece by piece; `events` collects what a stream sends."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # call index → its item

    def _event(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, **fields})

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _start(self, item: dict[str, Any]) -> None:
        self.close()
        self.items.append(item)
        self._open = item
        self._event("response.output_item.added", output_index=self._index, item=dict(item))

    def close(self, status: str = "completed") -> None:
        item, self._open = self._open, None
        if item is None:
            return
        at = self.items.index(item)
        if item["type"] == "message":
            part = item["content"][0]
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=at,
                content_index=0,
                text=part["text"],
            )
            self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=at,
                content_index=0,
                part=dict(part),
            )
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            self._event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=at,
                content_index=0,
                text=text,
            )
        else:
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=at,
                arguments=item["arguments"],
            )
        item["status"] = status
        self._event("response.output_item.done", output_index=at, item=item)

    def add(self, piece: Piece) -> None:
        if piece.reasoning:
            if self._open is None or self._open["type"] != "reasoning":
                self._start(
                    {
                        "type": "reasoning",
                        "id": _item_id("rs"),
                        "summary": [],
                        "content": [{"type": "reasoning_text", "text": ""}],
                        "status": "in_progress",
                    }
                )
            assert self._open is not None
            self._open["content"][0]["text"] += piece.reasoning
            self._event(
                "response.reasoning_text.delta",
                item_id=self._open["id"],
                output_index=self._index,
                content_index=0,
                delta=piece.reasoning,
            )
        if piece.content:
            if self._open is None or self._open["type"] != "message":
                self._start(
                    {
                        "type": "message",
                        "id": _item_id("msg"),
                        "role": "assistant",
                        "status": "in_progress",
                        "content": [],
                    }
                )
                assert self._open is not None
                part = {"type": "output_text", "text": "", "annotations": []}
                self._open["content"].append(part)
                self._event(
                    "response.content_part.added",
                    item_id=self._open["id"],
                    output_index=self._index,
                    content_index=0,
                    part=dict(part),
                )
            assert self._open is not None
            self._open["content"][0]["text"] += piece.content
            self._event(
                "response.output_text.delta",
                item_id=self._open["id"],
                output_index=self._index,
                content_index=0,
                delta=piece.content,
                logprobs=[],
            )
        for call in piece.calls:
            if call.index not in self._calls:
                assert call.id is not None and call.name is not None
                item = {
                    "type": "function_call",
                    "id": _item_id("fc"),
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": "",
                    "status": "in_progress",
                }
                self._start(item)
                self._calls[call.index] = item
            item = self._calls[call.index]
            item["arguments"] += call.arguments
            if call.arguments:
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.items.index(item),
                    delta=call.arguments,
                )


def _response(
    generation: Generation,
    items: list[dict[str, Any]],
    status: str,
    usage: RequestUsage | None,
    created: int,
    reasoning: int | None = None,
) -> dict[str, Any]:
    ctx = generation.ctx
    echo = ctx.prepared.response_fields or {}
    return {
        "id": f"resp_{ctx.request_id.removeprefix('req_')}",
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "model": ctx.public_model,
        "output": items,
        "usage": usage_object(usage, reasoning) if usage is not None else None,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "tool_choice": echo.get("tool_choice") or ("auto" if echo.get("tools") else "none"),
        "tools": echo.get("tools") or [],
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "temperature": echo.get("temperature"),
        "top_p": echo.get("top_p"),
        "text": echo.get("text") or {"format": {"type": "text"}},
        "metadata": echo.get("metadata") or {},
        "store": bool(echo.get("store")),  # whether it was kept (responses/store.py)
    }


def _status(finish_reason: str | None) -> str:
    if finish_reason == "length":
        return "incomplete"
    return "failed" if finish_reason in ("error", "abort") else "completed"


Keep = Callable[[dict[str, Any]], Awaitable[bool]]  # stores a final answer; False: it could not


async def response_whole(
    generation: Generation, tokenizer: Tokenizer, keep: Keep | None = None
) -> dict[str, Any]:
    created = int(time.time())
    acc = await collect(generation)
    choice = acc.choices[0]
    prepared = generation.ctx.prepared
    reader = AnswerReader(prepared.tools, prepared.thinking)
    builder = OutputBuilder()
    builder.add(reader.feed("".join(choice.text)))
    builder.add(reader.end())
    status = _status(choice.finish_reason)
    builder.close("incomplete" if status == "incomplete" else "completed")
    reasoning = thinking_tokens(tokenizer, prepared, [choice.token_ids])
    response = _response(generation, builder.items, status, generation.usage(), created, reasoning)
    if keep is not None and status != "failed":
        response["store"] = await keep(response)
    return response


async def response_stream(
    generation: Generation, tokenizer: Tokenizer, keep: Keep | None = None
) -> AsyncIterator[bytes]:
    """OpenAI's event sequence; a kept answer is stored before its last event goes out, so
    a client that has seen `response.completed` can already follow it up."""
    created = int(time.time())
    prepared = generation.ctx.prepared
    reader = AnswerReader(prepared.tools, prepared.thinking)
    builder = OutputBuilder()
    sequence = 0

    def event(payload: dict[str, Any]) -> bytes:
        nonlocal sequence
        payload["sequence_number"] = sequence
        sequence += 1
        return sse(payload)

    shell = _response(generation, [], "in_progress", None, created)
    yield event({"type": "response.created", "response": shell})
    yield event({"type": "response.in_progress", "response": shell})
    finish: str | None = None
    output: list[int] = []
    try:
        async for _, chunk in generation:
            for delta in chunk.choices:
                output.extend(delta.token_ids)
                builder.add(reader.feed(delta.text))
                if delta.finish_reason:
                    finish = delta.finish_reason
                    builder.add(reader.end())
            for payload in builder.events:
                yield event(payload)
            builder.events.clear()
    except Exception:  # the engine or worker failed mid-stream
        failed = _response(generation, builder.items, "failed", None, created)
        failed["error"] = {"code": "server_error", "message": "the model failed while generating"}
        yield event({"type": "response.failed", "response": failed})
        return
    status = _status(finish)
    builder.close("incomplete" if status == "incomplete" else "completed")
    for payload in builder.events:
        yield event(payload)
    reasoning = thinking_tokens(tokenizer, prepared, [output])
    final = _response(generation, builder.items, status, generation.usage(), created, reasoning)
    if keep is not None and status != "failed":
        final["store"] = await keep(final)
    kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
    yield event({"type": kind.get(status, "response.failed"), "response": final})
