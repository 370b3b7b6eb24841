"""SSE events stay one line for every client, whatever text the tokens decode to."""

from __future__ import annotations

import json

from hydrant.platform.inference.render import sse

# Every character Python's str.splitlines breaks on (httpx's iter_lines uses it).
LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def test_an_event_with_every_line_breaking_character_is_one_line_and_round_trips() -> None:
    text = f"a{LINE_BREAKS}b 。 é"
    event = sse({"choices": [{"delta": {"content": text}}]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    line = event[: -len(b"\n\n")].decode("utf-8")
    assert line.splitlines() == [line]  # no splitter finds a break inside the event
    assert json.loads(line[len("data: ") :]) == {"choices": [{"delta": {"content": text}}]}


def test_text_without_such_characters_is_left_as_the_encoder_wrote_it() -> None:
    event = sse({"content": "plain 。 text"})
    assert event == 'data: {"content":"plain 。 text"}\n\n'.encode()
