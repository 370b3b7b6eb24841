"""Tools on a chat request: what the model is shown, what constrains its output, and how
its text becomes tool calls.

`tool_choice` decides (as in vLLM):

- `none`: plain text. The tools still reach the template, so the model sees the same
  conversation it would with them.
- `{"type": "function", "function": {"name": N}}`: the output is N's arguments, held to
  N's `parameters` schema by the structured-output mask; the message is one call to N.
- `required`: the output is a JSON array of `{"name", "parameters"}`, each item held to
  its tool's schema, at least one item (exactly one without `parallel_tool_calls`).
- `auto` (the default when tools are given): the model writes freely and a parser finds
  the calls in its text. The format is the model's own, read from its chat template
  (Hermes `<tool_call>` tags, Mistral's `[TOOL_CALLS]`, or Llama 3.1's JSON); a
  template Hydrant cannot read makes `auto` a 400 that names the choices that work with
  any model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from hydrant.engine.output_constraints import canonical_schema, spec_error
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.schemas import ChatCompletionRequest

MAX_TOOLS = 128  # OpenAI's limit
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

ToolMode = Literal["named", "required", "auto"]
ParserName = Literal["hermes", "mistral", "llama3_json"]


@dataclass(frozen=True)
class ToolPlan:
    """How a request's output becomes tool calls (none: it stays text)."""

    mode: ToolMode
    function: str | None = None  # the forced function (named)
    parser: ParserName | None = None  # the model's format (auto)
    parallel: bool = True  # False: at most one call is returned (auto; required's schema)


@dataclass(frozen=True)
class ChatTools:
    """What a chat request's tools amount to."""

    definitions: list[dict[str, Any]] | None  # for the chat template
    plan: ToolPlan | None
    constraint: tuple[str, str] | None  # the engine's output constraint, for named/required


def template_parser(template: str | None) -> ParserName | None:
    """The tool-call format a chat template teaches its model, when Hydrant can parse it."""
    if not template or "tools" not in template:
        return None
    if "<tool_call>" in template:
        return "hermes"  # Hermes 2 Pro / 3, Qwen 2.5, Qwen 3
    if "[TOOL_CALLS]" in template:
        return "mistral"  # Mistral 7B v0.3, Mistral Small/Large, Mixtral 8x22B
    if '"parameters"' in template or "<|python_tag|>" in template:
        return "llama3_json"  # Llama 3.1 / 3.2 JSON tool calling
    return None


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's arguments schema; none, or `{}`, is OpenAI's empty argument list (an object)."""
    parameters: dict[str, Any] = tool["function"].get("parameters") or EMPTY_PARAMETERS
    return parameters


def _function(tool: Any, index: int) -> dict[str, Any]:
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise InvalidRequest(f'{where} must be an object with type "function"', param="tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise InvalidRequest(f"{where}.function must be an object", param="tools")
    name = function.get("name")
    if not (isinstance(name, str) and FUNCTION_NAME.fullmatch(name)):
        raise InvalidRequest(
            f"{where}.function.name must be 1-64 letters, digits, _ or -", param="tools"
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(f"{where}.function.description must be a string", param="tools")
    parameters = function.get("parameters", EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise InvalidRequest(
            f"{where}.function.parameters must be a JSON Schema object", param="tools"
        )
    problem = spec_error("json", canonical_schema(parameters))
    if problem is not None:
        raise InvalidRequest(f"{where}.function.parameters: {problem}", param="tools")
    return tool  # as sent: templates show the model the tool the client wrote


def _definitions(tools: list[Any] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not tools:
        raise InvalidRequest("tools must hold at least one tool, or be left out", param="tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequest(f"tools takes at most {MAX_TOOLS} tools", param="tools")
    definitions = [_function(tool, i) for i, tool in enumerate(tools)]
    names = [d["function"]["name"] for d in definitions]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidRequest(f"tools name the function {twice[0]!r} twice", param="tools")
    return definitions


def _choice(raw: str | dict[str, Any] | None, names: list[str]) -> str:
    """`none`, `auto`, `required`, or the forced function's name (as `=name`)."""
    if raw is None:
        return "auto" if names else "none"
    if not names:
        if raw == "none":
            return "none"
        raise InvalidRequest("tool_choice needs tools to choose from", param="tool_choice")
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise InvalidRequest(
                f"tool_choice must be none, auto, required or a function, got {raw!r}",
                param="tool_choice",
            )
        return raw
    function = raw.get("function") if raw.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequest(
            'tool_choice must look like {"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if name not in names:
        raise InvalidRequest(
            f"tool_choice names {name!r}, which is not in tools", param="tool_choice"
        )
    return "=" + name


def _required_schema(definitions: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON array of calls, each `{"name": tool, "parameters": its arguments}`."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [d["function"]["name"]]},
                "parameters": _parameters(d),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for d in definitions
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
        "minItems": 1,
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _auto_parser(template: str | None, configured: str | None) -> ParserName | None:
    """The operator's choice for the model (`none`: auto is off), else the template's."""
    if configured is None:
        return template_parser(template)
    if configured == "none":
        return None
    if configured not in get_args(ParserName):
        raise ValueError(f"unknown tool call parser {configured!r}")  # settings checked it
    return configured  # type: ignore[return-value]  # one of ParserName, checked above


def chat_tools(
    request: ChatCompletionRequest, template: str | None, configured_parser: str | None = None
) -> ChatTools:
    """The request's tools, checked: what the template shows and what the output becomes.

    `configured_parser` is the operator's setting for the model (HYDRANT_TOOL_CALL_PARSERS).
    """
    definitions = _definitions(request.tools)
    names = [d["function"]["name"] for d in definitions or []]
    choice = _choice(request.tool_choice, names)
    if choice == "none" or definitions is None:
        return ChatTools(definitions, None, None)
    if choice == "auto":
        parser = _auto_parser(template, configured_parser)
        if parser is None and configured_parser == "none":
            raise InvalidRequest(
                "tool_choice auto is turned off for this model by the operator; use "
                "tool_choice required or a named function",
                param="tool_choice",
            )
        if parser is None:
            raise InvalidRequest(
                "tool_choice auto needs a model whose chat template has a tool-call format "
                "Hydrant can read (Hermes <tool_call> tags, Mistral [TOOL_CALLS] or Llama 3.1 "
                "JSON); this model's has none. Use tool_choice required or a named function, "
                "which work with any model",
                param="tool_choice",
            )
        plan = ToolPlan("auto", parser=parser, parallel=request.parallel_tool_calls)
        return ChatTools(definitions, plan, None)
    if choice == "required":
        schema = _required_schema(definitions, request.parallel_tool_calls)
        return ChatTools(definitions, ToolPlan("required"), ("json", canonical_schema(schema)))
    name = choice[1:]
    parameters = _parameters(next(d for d in definitions if d["function"]["name"] == name))
    return ChatTools(
        definitions, ToolPlan("named", function=name), ("json", canonical_schema(parameters))
    )


def _arguments(text: str, index: int, call: int) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(
            f"messages[{index}].tool_calls[{call}].function.arguments must be JSON text: {exc}",
            param=f"messages[{index}].tool_calls",
        ) from exc


def template_message(message: Any, index: int, content: str | None) -> dict[str, Any]:
    """A chat message as templates expect it: tool calls with their arguments as objects
    (transformers' convention: templates write them with `tojson`), a tool turn with the
    id of the call it answers."""
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.name is not None:
        out["name"] = message.name
    if message.tool_calls:
        if message.role != "assistant":
            raise InvalidRequest(
                f"messages[{index}].tool_calls: only assistant messages carry tool calls",
                param=f"messages[{index}].tool_calls",
            )
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(call.function.arguments, index, j),
                },
            }
            for j, call in enumerate(message.tool_calls)
        ]
    if message.role == "tool":
        if not message.tool_call_id:
            raise InvalidRequest(
                f"messages[{index}]: a tool message needs the tool_call_id it answers",
                param=f"messages[{index}].tool_call_id",
            )
        out["tool_call_id"] = message.tool_call_id
    return out
