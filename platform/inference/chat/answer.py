"""A chat choice's text → reasoning, content and tool calls, piece by piece.

The thinking is split off first (reasoning.py); the answer after it is where tool
calls are looked for (tool_calls.py). A stream asks after every engine delta what
may go out; a whole response feeds its text the same way, so the two agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydrant.platform.inference.chat.reasoning import ReasoningReader, Split
from hydrant.platform.inference.chat.tool_calls import CallPiece, CallReader, reader_for
from hydrant.platform.inference.chat.tools import ToolPlan


@dataclass
class Piece:
    reasoning: str = ""
    content: str = ""
    calls: list[CallPiece] = field(default_factory=list)


class AnswerReader:
    """`thinking`: None when the model's output is not split (see `reasoning_start`),
    else whether it starts inside the thinking."""

    def __init__(self, plan: ToolPlan | None, thinking: bool | None) -> None:
        self._thinking = ReasoningReader(thinking) if thinking is not None else None
        self._calls: CallReader | None = reader_for(plan) if plan is not None else None

    def feed(self, text: str) -> Piece:
        split = self._thinking.feed(text) if self._thinking else Split(content=text)
        return self._route(split)

    def end(self) -> Piece:
        piece = self._route(self._thinking.end() if self._thinking else Split())
        if self._calls is not None:
            tail = self._calls.end()
            piece.content += tail.content
            piece.calls += tail.calls
        return piece

    def _route(self, split: Split) -> Piece:
        if self._calls is None or not split.content:
            return Piece(split.reasoning, split.content)
        step = self._calls.feed(split.content)
        return Piece(split.reasoning, step.content, step.calls)

    def finish_reason(self, reason: str | None) -> str | None:
        return self._calls.finish_reason(reason) if self._calls is not None else reason


@dataclass(frozen=True)
class WholeCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class WholeAnswer:
    reasoning: str
    content: str
    calls: list[WholeCall]
    finish_reason: str | None


def read_whole(
    text: str, reason: str | None, plan: ToolPlan | None, thinking: bool | None
) -> WholeAnswer:
    """A whole choice: the stream's pieces, joined."""
    reader = AnswerReader(plan, thinking)
    pieces = [reader.feed(text), reader.end()]
    arguments: dict[int, list[str]] = {}
    heads: dict[int, CallPiece] = {}
    for call in (c for p in pieces for c in p.calls):
        heads.setdefault(call.index, call)
        arguments.setdefault(call.index, []).append(call.arguments)
    calls = []
    for index, head in sorted(heads.items()):
        assert head.id is not None and head.name is not None
        calls.append(WholeCall(head.id, head.name, "".join(arguments[index])))
    return WholeAnswer(
        reasoning="".join(p.reasoning for p in pieces),
        content="".join(p.content for p in pieces),
        calls=calls,
        finish_reason=reader.finish_reason(reason),
    )
