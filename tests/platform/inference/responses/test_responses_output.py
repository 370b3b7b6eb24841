"""The Responses API's output items and events, built from an answer's pieces; and the
chat request a Responses request maps to. Pure logic; the API itself, through the
`openai` client against a real server: tests/e2e/test_responses_api.py."""

from __future__ import annotations

import pytest

from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.chat.answer import AnswerReader, Piece
from hydrant.platform.inference.chat.tools import ToolPlan
from hydrant.platform.inference.responses.prepare import ResponsesRequest, as_chat
from hydrant.platform.inference.responses.render import OutputBuilder

TEXT = '<think>Check.</think>\n\nSure.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'


def _build(pieces: list[Piece]) -> OutputBuilder:
    builder = OutputBuilder()
    for piece in pieces:
        builder.add(piece)
    builder.close()
    return builder


def _items(builder: OutputBuilder) -> list[tuple[str, str]]:
    """Each item as (type, text), ids left out (they are fresh per build)."""
    out = []
    for item in builder.items:
        if item["type"] == "function_call":
            out.append(("function_call", f"{item['name']}:{item['arguments']}"))
        else:
            out.append((item["type"], item["content"][0]["text"]))
    return out


def test_items_in_order_and_streamed_alike() -> None:
    plan = ToolPlan("auto", parser="hermes")
    whole_reader = AnswerReader(plan, False)
    whole = _build([whole_reader.feed(TEXT), whole_reader.end()])
    assert _items(whole) == [
        ("reasoning", "Check."),
        ("message", "Sure."),
        ("function_call", 'f:{"a":1}'),
    ]
    assert all(item["status"] == "completed" for item in whole.items)
    streamed_reader = AnswerReader(plan, False)
    streamed = _build([*(streamed_reader.feed(c) for c in TEXT), streamed_reader.end()])
    assert _items(streamed) == _items(whole)
    kinds = [e["type"] for e in streamed.events]
    assert kinds[0] == "response.output_item.added"
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 3
    )
    # Each item is closed before the next opens, at its own output index.
    opened = [e["output_index"] for e in streamed.events if e["type"].endswith("item.added")]
    closed = [e["output_index"] for e in streamed.events if e["type"].endswith("item.done")]
    assert opened == closed == [0, 1, 2]
    text = "".join(e["delta"] for e in streamed.events if e["type"] == "response.output_text.delta")
    assert text == "Sure."


def test_input_items_become_the_chat_conversation() -> None:
    request = ResponsesRequest(
        model="m",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Two cities?"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "4"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
        ],
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice={"type": "function", "name": "f"},
        text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        max_output_tokens=9,
    )
    chat = as_chat(request)
    roles = [m.role for m in chat.messages]
    assert roles == ["system", "user", "assistant", "tool"]  # parallel calls: one turn
    assert [c.id for c in chat.messages[2].tool_calls or []] == ["c1", "c2"]
    assert chat.messages[3].tool_call_id == "c1"
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    }
    assert chat.max_tokens == 9
    with pytest.raises(InvalidRequest) as refused:
        as_chat(ResponsesRequest(model="m", input=[{"type": "function_call", "name": "f"}]))
    assert refused.value.param == "input"
