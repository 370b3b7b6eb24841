"""Any text a model writes, in any split, through any tool format and thinking mode.

Why: the readers run on every chat response; one exception there is a 500 for a
whole response or a broken stream, and a model can write anything. Texts are built
from the fragments the readers look for (tags, their prefixes, braces, quotes,
escapes) so near-misses are common. For every text and split: no exception, the
stream gives what the whole response gives, and nothing is lost: reasoning plus
content are exactly the text split at the tags (checked against a plain oracle
without tools, where no call can take text away).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hydrant.platform.inference.chat.answer import AnswerReader, read_whole
from hydrant.platform.inference.chat.tools import ToolPlan

FRAGMENTS = [
    "<think>",
    "</think>",
    "</think>\n\n",
    " <think>",
    "<thi",
    "</th",
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "[TOOL_CALLS]",
    "[TOOL",
    "<|python_tag|>",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"name": "g", "parameters": {}}',
    '[{"name":"f","parameters":{"x":"]}"}}',
    "{",
    "}",
    "[",
    "]",
    ",",
    ";",
    '"',
    "\\",
    '\\"',
    " ",
    "\n",
    "word",
    "长江",
    # whole calls, so that splits land inside real ones too
    '<tool_call>\n{"name": "f", "arguments": {"a": "</tool_call>"}}\n</tool_call>',
    '[TOOL_CALLS] [{"name": "f", "arguments": {"a": [1]}}]',
    "<think>why</think>\n",
]
PLANS = [
    None,
    ToolPlan("auto", parser="hermes"),
    ToolPlan("auto", parser="mistral"),
    ToolPlan("auto", parser="llama3_json"),
    ToolPlan("required"),
    ToolPlan("named", function="f"),
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=14).map("".join)


def _streamed(
    text: str, cuts: list[int], plan: ToolPlan | None, thinking: bool | None
) -> tuple[str, str, list[tuple[str, str]]]:
    reader = AnswerReader(plan, thinking)
    bounds = sorted({c for c in cuts if 0 < c < len(text)})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    reasoning, content = "", ""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for piece in [*pieces, None]:
        out = reader.end() if piece is None else reader.feed(piece)
        reasoning += out.reasoning
        content += out.content
        for call in out.calls:
            if call.name is not None:
                names[call.index] = call.name
            arguments[call.index] = arguments.get(call.index, "") + call.arguments
    return reasoning, content, [(names[i], arguments[i]) for i in sorted(names)]


@settings(max_examples=1500, deadline=None)
@given(data=st.data(), text=texts, thinking=st.sampled_from([None, False, True]))
def test_readers_never_fail_and_stream_as_they_answer(
    data: st.DataObject, text: str, thinking: bool | None
) -> None:
    cuts = data.draw(st.lists(st.integers(min_value=0, max_value=max(len(text), 1)), max_size=8))
    for plan in PLANS:
        whole = read_whole(text, "stop", plan, thinking)
        expected = (whole.reasoning, whole.content, [(c.name, c.arguments) for c in whole.calls])
        assert _streamed(text, cuts, plan, thinking) == expected, plan
    plain = read_whole(text, "stop", None, thinking)
    assert (plain.reasoning, plain.content) == _split_oracle(text, thinking)


def _split_oracle(text: str, thinking: bool | None) -> tuple[str, str]:
    """The split, written plainly over the whole text: an opening tag (after whitespace)
    unless the prompt opened it, reasoning up to the first closing tag, the answer after
    it without its leading whitespace; no closing tag, all reasoning."""
    if thinking is None:
        return "", text
    rest = text
    if not thinking:
        if not text.lstrip().startswith("<think>"):
            return "", text
        rest = text.lstrip()[len("<think>") :]
    reasoning, closed, answer = rest.partition("</think>")
    return reasoning, answer.lstrip() if closed else ""
