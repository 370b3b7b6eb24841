"""Tool calls read from a model's text: per format, whole and streamed in any split, alike.

Pure logic (no model): the gateway's `CallReader`s and the request-side checks of
`tools.py`. The same paths against the real demo model and the `openai` client are in
tests/e2e/test_openai_client.py.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest

from hydrant.engine.demo_model import LLAMA3_CHAT_TEMPLATE
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.inference.chat.answer import read_whole
from hydrant.platform.inference.chat.tool_calls import reader_for
from hydrant.platform.inference.chat.tools import ToolPlan, chat_tools, template_parser
from hydrant.platform.inference.schemas import ChatCompletionRequest, ChatMessage

HERMES = ToolPlan("auto", parser="hermes")
LLAMA3 = ToolPlan("auto", parser="llama3_json")
MISTRAL = ToolPlan("auto", parser="mistral")
REQUIRED = ToolPlan("required")
NAMED = ToolPlan("named", function="get_weather")


def _streamed(plan: ToolPlan, pieces: list[str], reason: str) -> tuple[str, list[Any], str | None]:
    """What a stream of `pieces` gives a client once it joins the deltas, as
    `read_whole` gives it: content, calls as (name, arguments), finish reason."""
    reader = reader_for(plan)
    content = ""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    ids: dict[int, str] = {}
    for i, piece in enumerate(pieces):
        steps = [reader.feed(piece)]
        if i == len(pieces) - 1:
            steps.append(reader.end())
        for step in steps:
            content += step.content
            for call in step.calls:
                if call.id is not None:
                    assert call.index not in ids, "a call is opened once"
                    ids[call.index], names[call.index] = call.id, call.name or ""
                arguments[call.index] = arguments.get(call.index, "") + call.arguments
    calls = [(names[i], arguments[i]) for i in sorted(names)]
    return content, calls, reader.finish_reason(reason)


def _whole(plan: ToolPlan, text: str, reason: str = "stop") -> tuple[str, list[Any], str | None]:
    answer = read_whole(text, reason, plan, None)
    assert answer.reasoning == ""
    for call in answer.calls:  # Mistral's template takes back 9 letters and digits only
        if plan.parser == "mistral":
            assert len(call.id) == 9 and call.id.isalnum()
        else:
            assert call.id.startswith("call_") and len(call.id) == 29
    return answer.content, [(c.name, c.arguments) for c in answer.calls], answer.finish_reason


def _splits(text: str, rng: random.Random) -> list[list[str]]:
    """The text in one piece, per character, and cut at random places."""
    ways = [[text], list(text)]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 6))))
        ways.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)])
    return ways


CASES = [
    (
        HERMES,
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n'
        "</tool_call>\n",
        ("Let me look.", [("get_weather", '{"city":"Oslo"}'), ("get_time", '{"zone":"CET"}')]),
        "tool_calls",
    ),
    (HERMES, "No tools needed: 2 < 3.\n", ("No tools needed: 2 < 3.\n", []), "stop"),
    (
        HERMES,
        "<tool_call>not json</tool_call> then text",
        ("<tool_call>not json</tool_call> then text", []),
        "stop",
    ),
    (
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "get_time", "parameters": {}}',
        ("", [("get_weather", '{"city":"Oslo"}'), ("get_time", "{}")]),
        "tool_calls",
    ),
    (LLAMA3, "  The weather is fine {really}.", ("  The weather is fine {really}.", []), "stop"),
    (LLAMA3, '{"name": "get_weather", "param', ('{"name": "get_weather", "param', []), "stop"),
    (
        MISTRAL,
        ' [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {}}]',
        ("", [("get_weather", '{"city":"Oslo"}'), ("get_time", "{}")]),
        "tool_calls",
    ),
    (  # the marker is a special token, left out of the text
        MISTRAL,
        '[{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        ("", [("get_weather", '{"city":"Oslo"}')]),
        "tool_calls",
    ),
    (MISTRAL, "[1, 2] are the numbers.", ("[1, 2] are the numbers.", []), "stop"),
    (MISTRAL, "Plain [TOOL", ("Plain [TOOL", []), "stop"),
    (
        REQUIRED,
        '[{"name":"get_weather","parameters":{"city":"Oslo [north]"}},'
        '{"name":"get_time","parameters":{"zone":"C\\"ET}"}}]',
        ("", [("get_weather", '{"city":"Oslo [north]"}'), ("get_time", '{"zone":"C\\"ET}"}')]),
        "tool_calls",
    ),
    (
        NAMED,
        '{"city":"Oslo","days":[1,2]}',
        ("", [("get_weather", '{"city":"Oslo","days":[1,2]}')]),
        "stop",  # a forced function ends as OpenAI ends it
    ),
]


@pytest.mark.parametrize(("plan", "text", "expected", "reason"), CASES)
def test_whole_and_every_split_of_the_stream_agree(
    plan: ToolPlan, text: str, expected: tuple[str, list[Any]], reason: str
) -> None:
    assert _whole(plan, text) == (*expected, reason)
    for pieces in _splits(text, random.Random(text)):
        assert _streamed(plan, pieces, "stop") == (*expected, reason), pieces


def test_hermes_content_goes_out_before_the_call_closes() -> None:
    """Text streams at once; only what could be the start of `<tool_call>` waits."""
    reader = reader_for(HERMES)
    assert reader.feed("Checking").content == "Checking"
    assert reader.feed(" now <tool").content == " now"
    held = reader.feed('_call>{"name": "f", "arguments": {}}')
    assert held.content == "" and held.calls == []
    closed = reader.feed("</tool_call>")
    assert [(c.name, c.arguments) for c in closed.calls] == [("f", "{}")]


def test_named_arguments_stream_as_they_come() -> None:
    reader = reader_for(NAMED)
    first = reader.feed('{"ci')
    assert [(c.index, c.name, c.arguments) for c in first.calls] == [(0, "get_weather", '{"ci')]
    assert first.calls[0].id is not None
    later = reader.feed('ty":"Oslo"}')
    assert [(c.index, c.id, c.name, c.arguments) for c in later.calls] == [
        (0, None, None, 'ty":"Oslo"}')
    ]


def test_cut_short_output_keeps_every_character() -> None:
    """At `length` the reason stays `length`, and what did not parse is content."""
    text = '[{"name":"f","parameters":{"a":1}},{"name":"g","param'
    content, calls, reason = _whole(REQUIRED, text, "length")
    assert calls == [("f", '{"a":1}')]
    assert content == ',{"name":"g","param'
    assert reason == "length"
    content, calls, reason = _whole(HERMES, 'Hm <tool_call>{"name": "f", "argu', "length")
    assert (content, calls, reason) == ('Hm <tool_call>{"name": "f", "argu', [], "length")
    content, calls, _ = _whole(HERMES, '<tool_call>{"name": "f", "arguments": {}}', "length")
    assert (content, calls) == ("", [("f", "{}")])  # the JSON was complete; the tag was not


def test_template_formats() -> None:
    assert template_parser(LLAMA3_CHAT_TEMPLATE) == "llama3_json"
    hermes = "{% if tools %}<tools>{{ tools }}</tools> use <tool_call>{...}</tool_call>{% endif %}"
    assert template_parser(hermes) == "hermes"
    mistral = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}{% endif %}[TOOL_CALLS]"
    assert template_parser(mistral) == "mistral"
    assert template_parser("{{ messages }}") is None
    assert template_parser(None) is None


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="m", messages=[ChatMessage(role="user", content="hi")], **fields
    )


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: takes none


def test_required_schema_takes_exactly_calls_to_the_tools() -> None:
    tools = chat_tools(_request(tools=[WEATHER, TIME], tool_choice="required"), None)
    assert tools.plan == ToolPlan("required")
    assert tools.constraint is not None and tools.constraint[0] == "json"
    schema = json.loads(tools.constraint[1])
    ok = [
        {"name": "get_weather", "parameters": {"city": "Oslo"}},
        {"name": "get_time", "parameters": {}},
    ]
    jsonschema.validate(ok, schema)
    for bad in (
        [],
        [{"name": "get_weather", "parameters": {}}],  # city is required
        [{"name": "launch", "parameters": {}}],
        [{"name": "get_time", "parameters": {}, "extra": 1}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = chat_tools(
        _request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), None
    )
    assert single.constraint is not None
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([ok[0], ok[0]], json.loads(single.constraint[1]))


def test_named_choice_is_held_to_that_functions_schema() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    tools = chat_tools(_request(tools=[WEATHER, TIME], tool_choice=choice), None)
    assert tools.plan == ToolPlan("named", function="get_weather")
    assert tools.constraint is not None
    assert json.loads(tools.constraint[1]) == WEATHER["function"]["parameters"]  # type: ignore[index]


def test_auto_needs_a_format_and_none_leaves_text() -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_tools(_request(tools=[WEATHER]), "{{ messages }}")
    assert refused.value.param == "tool_choice"
    auto = chat_tools(_request(tools=[WEATHER]), LLAMA3_CHAT_TEMPLATE)
    assert auto.plan == ToolPlan("auto", parser="llama3_json") and auto.constraint is None
    none = chat_tools(_request(tools=[WEATHER], tool_choice="none"), "{{ messages }}")
    assert none.plan is None and none.definitions is not None  # the template still sees them
    assert chat_tools(_request(), None).plan is None


def test_the_operators_parser_overrides_the_template() -> None:
    """HYDRANT_TOOL_CALL_PARSERS: a format for a template Hydrant misreads or cannot read,
    or `none` to turn auto off; the other choices do not depend on it."""
    hermes = chat_tools(_request(tools=[WEATHER]), LLAMA3_CHAT_TEMPLATE, "hermes")
    assert hermes.plan == ToolPlan("auto", parser="hermes")
    unread = chat_tools(_request(tools=[WEATHER]), "{{ messages }}", "mistral")
    assert unread.plan == ToolPlan("auto", parser="mistral")
    with pytest.raises(InvalidRequest, match="turned off") as refused:
        chat_tools(_request(tools=[WEATHER]), LLAMA3_CHAT_TEMPLATE, "none")
    assert refused.value.param == "tool_choice"
    required = chat_tools(_request(tools=[WEATHER], tool_choice="required"), None, "none")
    assert required.plan == ToolPlan("required")


@pytest.mark.parametrize(
    ("plan", "text"),
    [
        (
            HERMES,
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        ),
        (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time"}'),
        (
            MISTRAL,
            '[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time"}]',
        ),
    ],
)
def test_without_parallel_calls_auto_returns_the_first_call_only(plan: ToolPlan, text: str) -> None:
    single = ToolPlan("auto", parser=plan.parser, parallel=False)
    expected = ("", [("get_weather", '{"city":"Oslo"}')], "tool_calls")
    assert _whole(plan, text)[1][1][0] == "get_time"  # both, when parallel calls are allowed
    assert _whole(single, text) == expected
    for pieces in _splits(text, random.Random(3)):
        assert _streamed(single, pieces, "stop") == expected
