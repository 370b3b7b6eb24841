"""A thinking model's `<think>` text split from its answer, whole and streamed in any split.

Pure logic; against a real server and the `openai` client: tests/e2e/test_reasoning_server.py.
"""

from __future__ import annotations

import random

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from hydrant.engine.tokenizer import Tokenizer
from hydrant.platform.inference.chat.answer import AnswerReader, read_whole
from hydrant.platform.inference.chat.reasoning import (
    constraint_after_thinking,
    reasoning_start,
    reasoning_tokens,
)
from hydrant.platform.inference.chat.tools import ToolPlan

HERMES = ToolPlan("auto", parser="hermes")
QWEN3_LIKE = "{% for m in messages %}{{ m.content }}{% endfor %}<think>{{ '' }}"


def _streamed(
    text: str, cuts: list[int], plan: ToolPlan | None, inside: bool
) -> tuple[str, str, list[str]]:
    reader = AnswerReader(plan, inside)
    reasoning, content, calls = "", "", []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for piece in [*pieces, None]:
        out = reader.end() if piece is None else reader.feed(piece)
        reasoning += out.reasoning
        content += out.content
        calls += [c.name or "" for c in out.calls if c.name]
    return reasoning, content, calls


CASES = [
    ("<think>\nHmm, 2 < 3.\n</think>\n\nYes.", False, None, ("\nHmm, 2 < 3.\n", "Yes.", [])),
    ("  <think>a</think>b", False, None, ("a", "b", [])),
    ("Hmm.</think>\n\nYes.", True, None, ("Hmm.", "Yes.", [])),  # the prompt opened the tag
    ("Just an answer <thin", False, None, ("", "Just an answer <thin", [])),
    ("Still thinking when cut </thi", True, None, ("Still thinking when cut </thi", "", [])),
    (
        '<think>call it</think>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        False,
        HERMES,
        ("call it", "", ["f"]),
    ),
    (
        "<think>no</think>The tag <tool_call> is text here.",
        False,
        HERMES,
        ("no", "The tag <tool_call> is text here.", []),
    ),
]


@pytest.mark.parametrize(("text", "inside", "plan", "expected"), CASES)
def test_whole_and_every_split_agree(
    text: str, inside: bool, plan: ToolPlan | None, expected: tuple[str, str, list[str]]
) -> None:
    answer = read_whole(text, "stop", plan, inside)
    assert (answer.reasoning, answer.content, [c.name for c in answer.calls]) == expected
    rng = random.Random(text)
    splits = [[], list(range(1, len(text)))]
    splits += [sorted(rng.sample(range(1, len(text)), k=rng.randint(1, 5))) for _ in range(30)]
    for cuts in splits:
        assert _streamed(text, cuts, plan, inside) == expected, cuts


def test_reasoning_goes_out_as_it_comes() -> None:
    reader = AnswerReader(None, True)
    assert reader.feed("Let me").reasoning == "Let me"
    held = reader.feed(" see</th")
    assert (held.reasoning, held.content) == (" see", "")
    done = reader.feed("ink>\n\nIt is 4.")
    assert (done.reasoning, done.content) == ("", "It is 4.")


def test_the_prompt_says_where_the_output_starts() -> None:
    assert reasoning_start(None, "<think>\n") is None
    assert reasoning_start("{{ messages }}", "x") is None  # a template that never thinks
    assert reasoning_start(QWEN3_LIKE, "user: hi\nassistant: <think>\n") is True
    assert reasoning_start(QWEN3_LIKE, "assistant: <think>\n\n</think>\n\n") is False  # off
    assert reasoning_start(QWEN3_LIKE, "assistant: ") is False


def _word_tokenizer(*added: str) -> Tokenizer:
    """Characters as tokens, plus `added` as whole tokens (not special, as Qwen 3 has them)."""
    vocab = {c: i for i, c in enumerate("<>/thinkabc ")}
    backend = BackendTokenizer(models.WordLevel(vocab, unk_token=" "))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    backend.decoder = decoders.Fuse()  # the tokens' text joined, as written
    backend.add_tokens([AddedToken(a, special=False, normalized=False) for a in added])
    return Tokenizer(backend, special_tokens_map={}, eos_token_ids=frozenset(), bos_token_id=None)


def test_a_constraint_waits_for_a_one_token_end_of_thinking() -> None:
    one_token = _word_tokenizer("</think>")
    close = one_token.token_to_id("</think>")
    assert close is not None
    assert constraint_after_thinking(one_token, "user: hi\nassistant: <think>\n") == close
    assert constraint_after_thinking(one_token, "user: hi\nassistant: ") == close
    # The prompt closed the thinking (thinking off): the form holds from the first token.
    closed = "assistant: <think>\n\n</think>\n\n"
    assert constraint_after_thinking(one_token, closed) is None
    # Spelled in pieces, the end cannot be waited for as one token.
    assert len(_word_tokenizer().encode("</think>", add_special_tokens=False)) > 1
    assert constraint_after_thinking(_word_tokenizer(), "assistant: <think>\n") is None


@pytest.mark.parametrize("added", [("</think>",), ()])
@pytest.mark.parametrize(
    ("output", "inside", "thinking"),
    [
        ("<think>ab</think>c", False, "<think>ab</think>"),
        ("  <think>a</think>", False, "  <think>a</think>"),
        ("ab</think>cba", True, "ab</think>"),  # the prompt opened the tag
        ("abc", True, "abc"),  # cut short while thinking: all of it
        ("abc</think>", False, ""),  # never opened: an answer, whatever it holds
        ("</think>abc", True, "</think>"),
    ],
)
def test_reasoning_tokens_are_those_up_to_the_close(
    added: tuple[str, ...], output: str, inside: bool, thinking: str
) -> None:
    """Counted on the tokens, with `</think>` one token (Qwen 3) or spelled in pieces."""
    tokenizer = _word_tokenizer(*added)
    ids = tokenizer.encode(output, add_special_tokens=False)
    expected = len(tokenizer.encode(thinking, add_special_tokens=False)) if thinking else 0
    assert ids[:expected] == tokenizer.encode(thinking, add_special_tokens=False)
    assert reasoning_tokens(tokenizer, ids, inside) == expected
