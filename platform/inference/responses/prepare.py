"""OpenAI's Responses API (`POST /v1/responses`), stateless, on the chat path.

A Responses request is a chat request in other words: `input` items become messages
(`function_call` and `function_call_output` items become the assistant's tool calls
and the tools' answers), `instructions` a leading system message, flat function
`tools` the chat form, `text.format` the `response_format`. It is then prepared,
admitted, metered and billed exactly as `/v1/chat/completions` is, so there is one
request path; responses/render.py turns the answer into output items and events.

Answers are stored unless `store` is false (responses/store.py): a follow-up's
`previous_response_id` is resolved into its conversation's items before the request
gets here. OpenAI's `conversation` objects are not kept: a 400.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.chat.prepare import prepare_chat
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.inference.schemas import ChatCompletionRequest
from hydrant.platform.models.registry import ServedModel

MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})


class ResponsesRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    metadata: dict[str, Any] | None = None  # also the ledger's tags (ledger/attribution.py)
    user: str | None = None
    safety_identifier: str | None = None  # OpenAI's newer name for `user` (hashed, ledger)
    previous_response_id: str | None = None
    conversation: Any = None
    priority: int = 0  # Hydrant's (as on the chat endpoints)


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (`input_text`, `output_text`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of parts", param="input")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(
            part.get("text"), str
        ):
            raise InvalidRequest(
                f"{where}.content: only text parts are supported, got {kind!r}", param="input"
            )
        texts.append(part["text"])
    return "".join(texts)


def _call_item(item: dict[str, Any], where: str) -> dict[str, Any]:
    fields = (item.get("call_id"), item.get("name"), item.get("arguments"))
    if not all(isinstance(f, str) for f in fields):
        raise InvalidRequest(
            f"{where}: a function_call needs call_id, name and arguments (strings)", param="input"
        )
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _messages(request: ResponsesRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        return [*messages, {"role": "user", "content": request.input}]
    for index, item in enumerate(request.input):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise InvalidRequest(
                    f"{where}.role must be one of {', '.join(sorted(MESSAGE_ROLES))}", param="input"
                )
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = _call_item(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise InvalidRequest(
                    f"{where}: a function_call_output needs its call_id", param="input"
                )
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": output if isinstance(output, str) else _text(output, where),
                }
            )
        elif kind == "reasoning":
            continue  # an earlier answer's thinking: templates drop it from history
        else:
            raise InvalidRequest(f"{where}.type {kind!r} is not supported", param="input")
    return messages


def _tools(tools: list[Any] | None) -> list[Any] | None:
    """Flat function tools (`{"type": "function", "name", ...}`) in the chat form."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise InvalidRequest(
                f"tools[{index}]: only function tools are supported, got {kind!r}", param="tools"
            )
        function = {k: v for k, v in tool.items() if k != "type"}
        converted.append({"type": "function", "function": function})
    return converted


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as the chat endpoint's `response_format`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest("text.format must be an object", param="text")
    if fmt.get("type") != "json_schema":
        return {"type": fmt.get("type")}
    schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def as_chat(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request a Responses request asks for."""
    if request.conversation is not None:
        raise InvalidRequest(
            "conversation objects are not kept by this server: use previous_response_id, "
            "or send the whole conversation in input",
            param="conversation",
        )
    if request.previous_response_id is not None:  # the controller resolves it first
        raise InvalidRequest("previous_response_id was not resolved", param="previous_response_id")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise InvalidRequest("max_output_tokens must be at least 1", param="max_output_tokens")
    fields: dict[str, Any] = {
        "model": request.model,
        "messages": _messages(request),
        "max_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "tools": _tools(request.tools),
        "tool_choice": _tool_choice(request.tool_choice),
        "parallel_tool_calls": request.parallel_tool_calls,
        "response_format": _response_format(request.text),
        "stream": request.stream,
        "user": request.user,
        "priority": request.priority,
    }
    try:
        return msgspec.convert(
            {k: v for k, v in fields.items() if v is not None}, ChatCompletionRequest
        )
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid request: {exc}", param="input") from exc


ECHOED = (
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "metadata",
    "store",
)


def prepare_response(
    request: ResponsesRequest, model: ServedModel, default_max_tokens: int
) -> PreparedRequest:
    prepared = prepare_chat(as_chat(request), model, default_max_tokens)
    echo = {name: getattr(request, name) for name in ECHOED}  # the answer repeats them
    return dataclasses.replace(prepared, response_fields=echo)
