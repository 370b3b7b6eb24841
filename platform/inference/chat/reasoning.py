"""A reasoning model's thinking, split from its answer: `reasoning_content`, as the
DeepSeek API and vLLM's reasoning parsers return it.

DeepSeek-R1, QwQ and Qwen 3 think inside `<think>…</think>` before they answer. A
model whose chat template writes `<think>` gets its output split, with no setting:
what is inside the tags is `reasoning_content`, what follows is `content` (and, with
tools, where calls are looked for). Some templates open the tag in the prompt
(DeepSeek-R1's ends its generation prompt with `<think>\\n`), so the model starts inside
it; that is read from the rendered prompt. A model cut short while thinking has only
reasoning, as vLLM's `deepseek_r1` parser answers it.

A constrained answer (`response_format`, `structured_outputs`, a required or named
tool) of such a model is held to its form after `</think>`, not from the first token,
so the model still thinks first, as vLLM does with a reasoning parser; that needs
`</think>` to be one token of the vocabulary (Qwen 3's and DeepSeek-R1's are), the
one thing the engine can wait for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference.chat.markers import partial_suffix, undecided

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _prompt_thinking(prompt_text: str) -> Literal["none", "open", "closed"]:
    """Where the rendered prompt leaves the thinking: no tag, opened (the output starts
    inside it), or opened and closed already (Qwen 3 with `enable_thinking: false`)."""
    last_open = prompt_text.rfind(THINK_OPEN)
    if last_open < 0:
        return "none"
    return "closed" if prompt_text.find(THINK_CLOSE, last_open) >= 0 else "open"


def reasoning_start(template: str | None, prompt_text: str) -> bool | None:
    """None: the model does not think in tags (its output is not split); else whether its
    output starts inside the thinking (the prompt opened the tag)."""
    if not template or THINK_OPEN not in template:
        return None
    return _prompt_thinking(prompt_text) == "open"


def constraint_after_thinking(tokenizer: Tokenizer, prompt_text: str) -> int | None:
    """The token a thinking model's constraint waits for: `</think>`'s id, when it is one
    token and the prompt has not already closed the thinking; else None: constrained from
    the first token."""
    if _prompt_thinking(prompt_text) == "closed":
        return None
    token = tokenizer.token_to_id(THINK_CLOSE)
    if token is None or tokenizer.encode(THINK_CLOSE, add_special_tokens=False) != [token]:
        return None
    return token


def reasoning_tokens(tokenizer: Tokenizer, output_ids: Sequence[int], inside: bool) -> int:
    """How many of a choice's output tokens are its thinking, tags included: usage's
    `reasoning_tokens`, as OpenAI reports them (they are billed as output all the same).

    Read from the tokens, not from the split text, so it is exact whatever the tokens
    are (a `</think>` of one token or of several, several tokens to one delta): the
    thinking is the shortest prefix of the output whose text closes it, found by
    bisection, since a longer prefix's text holds a shorter one's. `inside`: the prompt
    opened the thinking (`reasoning_start`); else the output must open it itself, as
    `ReasoningReader` reads it. Cut short while thinking, every token was thinking.
    """
    text = tokenizer.decode(output_ids)
    if not inside and not text.lstrip().startswith(THINK_OPEN):
        return 0
    if THINK_CLOSE not in text:
        return len(output_ids)
    low, high = 1, len(output_ids)
    while low < high:
        middle = (low + high) // 2
        if THINK_CLOSE in tokenizer.decode(output_ids[:middle]):
            high = middle
        else:
            low = middle + 1
    return low


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""


class ReasoningReader:
    """Reads a choice's text as it streams; says what is reasoning and what is answer.
    Only what could be the start of a tag is held back."""

    def __init__(self, inside: bool) -> None:
        self._state = "inside" if inside else "before"  # before → inside → after
        self._pending = ""
        self._trim = False  # drop the whitespace that follows </think>

    def feed(self, text: str) -> Split:
        self._pending += text
        out = Split()
        while self._pending:
            if self._state == "before":
                head = self._pending.lstrip()
                if undecided(head, THINK_OPEN):
                    break  # not known yet
                if head.startswith(THINK_OPEN):
                    self._pending = head[len(THINK_OPEN) :]
                    self._state = "inside"
                else:
                    self._state = "after"
                continue
            if self._state == "inside":
                close = self._pending.find(THINK_CLOSE)
                if close >= 0:
                    out.reasoning += self._pending[:close]
                    self._pending = self._pending[close + len(THINK_CLOSE) :]
                    self._state, self._trim = "after", True
                    continue
                keep = partial_suffix(self._pending, THINK_CLOSE)
                out.reasoning += self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(self._pending) - keep :]
                break
            if self._trim:
                self._pending = self._pending.lstrip()
                if not self._pending:
                    break
                self._trim = False
            out.content += self._pending
            self._pending = ""
        return out

    def end(self) -> Split:
        """Flush what was held back: a tag that never completed is text."""
        rest, self._pending = self._pending, ""
        if self._state == "inside":
            return Split(reasoning=rest)
        return Split(content=rest.lstrip() if self._trim else rest)
