"""A choice's text → content and tool calls, as it streams.

One `CallReader` per choice reads the text piece by piece and says what may go
out now: content, and calls (a whole call, or for a named function the next
piece of its arguments). A non-streamed response feeds the whole text through
the same reader, so both forms of a response always agree. Text that looks like
a call but does not parse goes out as content: nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from hydrant.platform.inference.chat.markers import partial_suffix, undecided
from hydrant.platform.inference.chat.tools import ToolPlan

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"  # Llama 3.1 may open a JSON call with it
MISTRAL_TAG = "[TOOL_CALLS]"


def call_id() -> str:
    """A fresh tool call id, in OpenAI's form (`call_` and 24 characters)."""
    return "call_" + secrets.token_hex(12)


@dataclass
class CallPiece:
    """A call (`index` in the message) or, for a named function, part of one: the first
    piece of a call carries its id and name, later ones only more arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass
class Step:
    content: str = ""
    calls: list[CallPiece] = field(default_factory=list)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _call_fields(text: str, arguments_key: tuple[str, ...]) -> tuple[str, str] | None:
    """`(name, arguments JSON)` of one call written as a JSON object, or None."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return _fields_of(value, arguments_key)


def _fields_of(value: Any, arguments_key: tuple[str, ...]) -> tuple[str, str] | None:
    """`(name, arguments JSON)` of one parsed call, or None if it is not one."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments: Any = next((value[k] for k in arguments_key if k in value), {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text already
        return value["name"], arguments
    return value["name"], _compact(arguments)


class CallReader:
    """Base: text passes through as content; subclasses find calls in it."""

    def __init__(self) -> None:
        self.calls = 0

    def feed(self, text: str) -> Step:
        return Step(content=text)

    def end(self) -> Step:
        return Step()

    def finish_reason(self, reason: str | None) -> str | None:
        """OpenAI's `tool_calls` when the model ended by calling tools."""
        return "tool_calls" if reason == "stop" and self.calls else reason

    def _new_id(self) -> str:
        return call_id()

    def _call(self, name: str, arguments: str) -> CallPiece:
        piece = CallPiece(self.calls, arguments, id=self._new_id(), name=name)
        self.calls += 1
        return piece


class NamedReader(CallReader):
    """The whole text is the arguments of the forced function, streamed as they come."""

    def __init__(self, function: str) -> None:
        super().__init__()
        self.function = function

    def feed(self, text: str) -> Step:
        if not self.calls:  # the first piece opens the call
            return Step(calls=[self._call(self.function, text)])
        return Step(calls=[CallPiece(0, text)]) if text else Step()

    def end(self) -> Step:
        return self.feed("")  # a call even when nothing was written

    def finish_reason(self, reason: str | None) -> str | None:
        return reason  # as OpenAI and vLLM answer a forced function: `stop`


class RequiredReader(CallReader):
    """A JSON array of `{"name", "parameters"}`: each item goes out once it is complete."""

    def __init__(self) -> None:
        super().__init__()
        self._text = ""
        self._scanned = 0  # characters of _text read by the scanner
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._item_start: int | None = None
        self._consumed = 0  # characters of _text given out as calls

    def feed(self, text: str) -> Step:
        self._text += text
        step = Step()
        for i in range(self._scanned, len(self._text)):
            char = self._text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
                continue
            if char == '"':
                self._in_string = True
            elif char in "[{":
                self._depth += 1
                if self._depth == 2 and char == "{":
                    self._item_start = i
            elif char in "]}":
                self._depth -= 1
                if self._depth == 1 and self._item_start is not None:
                    fields = _call_fields(self._text[self._item_start : i + 1], ("parameters",))
                    if fields is not None:
                        step.calls.append(self._call(*fields))
                        self._consumed = i + 1
                    self._item_start = None
        self._scanned = len(self._text)
        return step

    def end(self) -> Step:
        """A cut-short array: what did not become a call is content."""
        tail = self._text[self._consumed :]
        if self.calls and tail.strip() in ("]", ""):
            return Step()
        return Step(content=self._text if not self.calls else tail)


class HermesReader(CallReader):
    """Content, with calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

    Whitespace next to a call is the format's, not the answer's: it is held back and
    dropped unless more content follows (an answer with no call keeps all of its text)."""

    def __init__(self) -> None:
        super().__init__()
        self._pending = ""  # text not yet given out
        self._inside = False  # within a call's tags
        self._space = ""  # held-back whitespace outside calls
        self._searched = 0  # inside a call: where the close tag cannot start before

    def feed(self, text: str) -> Step:
        self._pending += text
        step = Step()
        while self._pending:
            if self._inside:
                # From where the last search stopped: a long call costs one pass, not n.
                close = self._pending.find(HERMES_CLOSE, self._searched)
                if close < 0:
                    self._searched = max(0, len(self._pending) - len(HERMES_CLOSE) + 1)
                    break
                self._searched = 0
                self._emit_call(self._pending[:close], step, closed=True)
                self._pending = self._pending[close + len(HERMES_CLOSE) :]
                self._inside = False
                continue
            start = self._pending.find(HERMES_OPEN)
            if start >= 0:
                self._content(self._pending[:start], step)
                self._pending = self._pending[start + len(HERMES_OPEN) :]
                self._inside = True
                continue
            keep = partial_suffix(self._pending, HERMES_OPEN)
            self._content(self._pending[: len(self._pending) - keep], step)
            self._pending = self._pending[len(self._pending) - keep :]
            break
        return step

    def _content(self, text: str, step: Step) -> None:
        body = text.rstrip()
        if body:
            step.content += self._space + body
            self._space = ""
        self._space += text[len(body) :]

    def _emit_call(self, body: str, step: Step, closed: bool) -> None:
        fields = _call_fields(body.strip(), ("arguments", "parameters"))
        if fields is None:  # not a call after all: the model's text, as written
            raw = HERMES_OPEN + body + (HERMES_CLOSE if closed else "")
            step.content += self._space + raw
            self._space = ""
            return
        self._space = ""  # the format's line breaks around the call
        step.calls.append(self._call(*fields))

    def end(self) -> Step:
        step = Step()
        if self._inside:  # cut short inside a call: a call if what came parses
            self._emit_call(self._pending, step, closed=False)
        elif self._pending:
            step.content += self._space + self._pending
            self._space = ""
        if not self.calls:
            step.content += self._space
        return step


class JsonAnswerReader(CallReader):
    """Formats where an answer that is JSON (after an optional marker) is calls and any
    other answer is content; which one is known at the first character that is not
    whitespace, and calls are parsed when the answer ends."""

    marker = ""  # a tag that may open the calls
    opening = "{"  # the JSON that opens them

    def __init__(self) -> None:
        super().__init__()
        self._buffer = ""
        self._mode: str | None = None  # "calls" or "content" once known

    def feed(self, text: str) -> Step:
        if self._mode == "content":
            return Step(content=text)
        self._buffer += text
        if self._mode is None:
            head = self._buffer.lstrip()
            if undecided(head, self.marker):
                return Step()  # not known yet
            calls = head.startswith(self.opening) or bool(
                self.marker and head.startswith(self.marker)
            )
            self._mode = "calls" if calls else "content"
            if self._mode == "content":
                out, self._buffer = self._buffer, ""
                return Step(content=out)
        return Step()  # calls: parsed whole at the end

    def end(self) -> Step:
        text, self._buffer = self._buffer, ""
        if self._mode != "calls":
            return Step(content=text)
        body = text.lstrip().removeprefix(self.marker).strip()
        found = self.parse(body)
        if found is None:  # not calls after all: the model's text, as written
            return Step(content=text)
        return Step(calls=[self._call(*fields) for fields in found])

    def parse(self, body: str) -> list[tuple[str, str]] | None:
        raise NotImplementedError


class Llama3JsonReader(JsonAnswerReader):
    """Llama 3.1's JSON tool calling: `{"name": ..., "parameters": {...}}`, optionally after
    `<|python_tag|>`, several joined by `;`."""

    marker = PYTHON_TAG

    def parse(self, body: str) -> list[tuple[str, str]] | None:
        decoder = json.JSONDecoder()
        found: list[tuple[str, str]] = []
        at = 0
        while at < len(body):
            try:
                value, at = decoder.raw_decode(body, at)
            except ValueError:
                return None
            fields = _fields_of(value, ("parameters", "arguments"))
            if fields is None:
                return None
            found.append(fields)
            rest = body[at:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:].lstrip()
            at = len(body) - len(rest)
        return found


class MistralReader(JsonAnswerReader):
    """Mistral's (v0.3 on): `[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}`. The
    marker is a special token, which the text leaves out, so a bare array counts too.
    Mistral's template takes back only ids of 9 letters and digits: its calls get those."""

    marker = MISTRAL_TAG
    opening = "["

    def parse(self, body: str) -> list[tuple[str, str]] | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, list) or not value:
            return None
        found = [_fields_of(item, ("arguments", "parameters")) for item in value]
        return None if None in found else [f for f in found if f is not None]

    def _new_id(self) -> str:
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))


class FirstCallReader(CallReader):
    """`parallel_tool_calls: false` under `auto`: the model's format may hold several
    calls, and the client asked for at most one; the first is returned, later ones are
    dropped (they are calls, not content)."""

    def __init__(self, inner: CallReader) -> None:
        super().__init__()
        self._inner = inner

    def feed(self, text: str) -> Step:
        return self._first(self._inner.feed(text))

    def end(self) -> Step:
        return self._first(self._inner.end())

    def finish_reason(self, reason: str | None) -> str | None:
        return self._inner.finish_reason(reason)

    @staticmethod
    def _first(step: Step) -> Step:
        step.calls = [c for c in step.calls if c.index == 0]
        return step


def reader_for(plan: ToolPlan) -> CallReader:
    reader = _format_reader(plan)
    return reader if plan.parallel or plan.mode != "auto" else FirstCallReader(reader)


def _format_reader(plan: ToolPlan) -> CallReader:
    if plan.mode == "named":
        assert plan.function is not None
        return NamedReader(plan.function)
    if plan.mode == "required":
        return RequiredReader()
    if plan.parser == "hermes":
        return HermesReader()
    if plan.parser == "mistral":
        return MistralReader()
    return Llama3JsonReader()
