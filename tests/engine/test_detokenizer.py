"""Streaming detokenization never splits a character; stop strings are found across deltas."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sp_tokenizer import write_sentencepiece_style

from hydrant.engine.demo_model import write_demo_tokenizer
from hydrant.engine.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer, StopStringMatcher
from hydrant.engine.tokenizer import Tokenizer

MULTIBYTE_TEXTS = [
    "你好，世界！我们明天一起去看海，好不好？",
    "春天来了 🌸 河边的柳树发出了新芽 🌿",
    "Family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 hearts ❤️💙 and 😀👍🎉🚀",
    "Mixed: un café crème à Genève, 加把劲 🏋️ 一起出发 🛫",
    "罕见的字：龘靐齉爩 and rare emoji 🦩🪼🫎",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory: Path = tmp_path_factory.mktemp("demo_tok")
    write_demo_tokenizer(directory)
    return Tokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """Llama 2 / Mistral shape: `▁` spaces, byte fallback, a decoder that strips one space."""
    return Tokenizer.from_pretrained(write_sentencepiece_style(tmp_path_factory.mktemp("sp")))


def _stream(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids]


@pytest.mark.parametrize("text", MULTIBYTE_TEXTS)
def test_streamed_deltas_equal_full_decode_without_broken_chars(
    tokenizer: Tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The test only means something if the BPE really splits characters across tokens.
    assert any(REPLACEMENT_CHAR in tokenizer.decode([i]) for i in ids)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[])
    deltas = _stream(detok, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert all(REPLACEMENT_CHAR not in d for d in deltas)
    assert detok.text == text
    assert detok.flush() == ""


def test_prompt_context_and_special_tokens(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode_chat([{"role": "user", "content": "说点什么 🙂"}])
    output = tokenizer.encode("好的 🎉 done", add_special_tokens=False)
    eot = tokenizer.token_to_id("<|eot_id|>")
    assert eot is not None
    ids = [*output, eot]
    skipped = IncrementalDetokenizer(tokenizer, prompt)
    assert "".join(_stream(skipped, ids)) == "好的 🎉 done"
    kept = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=False)
    assert "".join(_stream(kept, ids)) == "好的 🎉 done<|eot_id|>"


def test_text_is_held_until_the_character_completes(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("🦩", add_special_tokens=False)
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = _stream(detok, ids)
    assert deltas[:-1] == [""] * (len(ids) - 1)
    assert deltas[-1] == "🦩"


def test_flush_releases_an_unfinished_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 🦩", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = _stream(detok, ids[:-1])
    assert "".join(deltas) == "ok"  # the space travels with the emoji bytes
    tail = detok.flush()
    assert tail.endswith(REPLACEMENT_CHAR)
    assert detok.text == tokenizer.decode(ids[:-1])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_token_streams_reassemble(tokenizer: Tokenizer, data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=24))
    prompt = data.draw(st.lists(st.integers(0, 255), max_size=6))
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = _stream(detok, ids)
    full = "".join(deltas) + detok.flush()
    assert full == detok.text
    assert all(not d.endswith(REPLACEMENT_CHAR) for d in deltas)
    context = prompt[-5:]
    if not tokenizer.decode(context).endswith(REPLACEMENT_CHAR):
        assert tokenizer.decode(context) + full == tokenizer.decode(context + ids)


@pytest.mark.parametrize("answer", [" world", " 你好 🦩 ok", "\nnext line 🙂"])
def test_sentencepiece_output_keeps_the_space_before_its_first_word(
    sentencepiece: Tokenizer, answer: str
) -> None:
    """A SentencePiece decoder strips the leading space of the first token it decodes, so a
    lone decode of the output would glue its first word to the prompt; the prompt context
    in the window keeps it, as vLLM and transformers' full decode do."""
    prompt = sentencepiece.encode("Hello there", add_special_tokens=True)
    full = sentencepiece.encode("Hello there" + answer, add_special_tokens=True)
    assert full[: len(prompt)] == prompt
    output = full[len(prompt) :]
    assert sentencepiece.decode([*prompt, *output]) == "Hello there" + answer
    detok = IncrementalDetokenizer(sentencepiece, prompt)
    deltas = _stream(detok, output)
    assert "".join(deltas) + detok.flush() == answer
    assert all(REPLACEMENT_CHAR not in d for d in deltas)


def test_sentencepiece_byte_fallback_pieces_are_held_until_complete(
    sentencepiece: Tokenizer,
) -> None:
    ids = sentencepiece.encode("a 🦩", add_special_tokens=False)
    # The emoji is not in the vocabulary: it is its four UTF-8 bytes as <0xNN> tokens.
    assert [sentencepiece.token_bytes(i) for i in ids[-4:]] == [bytes([b]) for b in "🦩".encode()]
    detok = IncrementalDetokenizer(
        sentencepiece, sentencepiece.encode("x", add_special_tokens=True)
    )
    deltas = _stream(detok, ids)
    assert "".join(deltas) == " a 🦩"
    assert deltas[-1].endswith("🦩") and all(REPLACEMENT_CHAR not in d for d in deltas)


def _feed(matcher: StopStringMatcher, chunks: list[str]) -> tuple[str, int | None]:
    text = ""
    for chunk in chunks:
        text += chunk
        cut = matcher.check(text, len(chunk))
        if cut is not None:
            return text, cut
    return text, None


def test_stop_string_across_deltas() -> None:
    matcher = StopStringMatcher(["END"])
    assert matcher.max_holdback == 2
    text, cut = _feed(matcher, ["Hello E", "N", "D and more"])
    assert cut == 6
    assert text[:cut] == "Hello "
    assert matcher.last_match == "END"


def test_first_completed_stop_wins_and_include_option() -> None:
    matcher = StopStringMatcher(["abcd", "bc"])
    assert matcher.check("xxabcd", 4) == 3  # "bc" completes before "abcd"
    assert matcher.last_match == "bc"
    including = StopStringMatcher(["abcd", "bc"], include_stop_str=True)
    assert including.check("xxabcd", 4) == 5
    text, cut = _feed(StopStringMatcher(["。", "\n\n"]), ["第一句", "。第二", "句"])
    assert cut is not None
    assert text[:cut] == "第一句"


def test_only_new_region_is_searched() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.check("STOP then more", 3) is None
    assert matcher.check("xSTO", 1) is None
    assert matcher.check("xSTOP", 1) == 1
    assert StopStringMatcher([]).check("anything", 8) is None
    with pytest.raises(ValueError, match="empty"):
        StopStringMatcher([""])


def test_holdback_only_what_may_become_a_stop() -> None:
    matcher = StopStringMatcher(["</answer>", "STOP"])
    assert matcher.max_holdback == 8
    assert matcher.holdback_len("plain text") == 0
    assert matcher.holdback_len("result </ans") == 5
    assert matcher.holdback_len("go ST") == 2
    assert matcher.holdback_len("<") == 1


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet="abc", max_size=30),
    stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_chunking_does_not_change_the_cut(text: str, stops: list[str], cuts: list[int]) -> None:
    """Any split of the text into deltas gives the cut a char-by-char stream gives."""
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    _, by_chunks = _feed(StopStringMatcher(stops), chunks)
    _, by_chars = _feed(StopStringMatcher(stops), list(text))
    assert by_chunks == by_chars
    if by_chars is not None:
        assert any(text[by_chars:].startswith(s) for s in stops)


class _PythonOnly:
    """The same tokenizer seen only through `decode`: the detokenizer's Python window."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def _random_ids(tokenizer: Tokenizer, data: st.DataObject, size: int) -> list[int]:
    """Random ids, biased towards the ones that make streaming hard: specials, byte pieces."""
    vocab = tokenizer.vocab_size
    hard = sorted(tokenizer.special_token_ids) + list(range(min(vocab, 300)))
    return data.draw(
        st.lists(st.one_of(st.integers(0, vocab - 1), st.sampled_from(hard)), max_size=size)
    )


@pytest.mark.parametrize("which", ["demo", "sentencepiece"])
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_rust_stream_equals_the_python_window_and_the_full_decode(
    tokenizer: Tokenizer, sentencepiece: Tokenizer, which: str, data: st.DataObject
) -> None:
    """DecodeStream's deltas are the Python window's, delta for delta, for random token
    runs after random prompts, with special tokens skipped or kept; and they add up to
    the full decode after the prompt context."""
    tok = tokenizer if which == "demo" else sentencepiece
    prompt = _random_ids(tok, data, 8)
    ids = _random_ids(tok, data, 40)
    skip = data.draw(st.booleans())
    rust = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    python = IncrementalDetokenizer(_PythonOnly(tok), prompt, skip_special_tokens=skip)
    assert rust._stream is not None and python._stream is None
    rust_deltas = [*_stream(rust, ids), rust.flush()]
    assert rust_deltas == [*_stream(python, ids), python.flush()]
    assert rust.text == "".join(rust_deltas)
    context = prompt[-5:]
    before = tok.decode(context, skip_special_tokens=skip)
    if not before.endswith(REPLACEMENT_CHAR) and which == "demo":
        assert before + rust.text == tok.decode(context + ids, skip_special_tokens=skip)


def _text_ids(tokenizer: Tokenizer) -> list[int]:
    """Every id but the `<0xNN>` byte pieces: those alone can spell invalid UTF-8, which a
    full decode turns into U+FFFD runs that rewrite text already streamed."""
    return [
        i
        for i in range(tokenizer.vocab_size)
        if not tokenizer.backend.id_to_token(i).startswith("<0x")
    ]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_sentencepiece_random_streams_equal_the_full_decode(
    sentencepiece: Tokenizer, data: st.DataObject
) -> None:
    pool = st.sampled_from(_text_ids(sentencepiece))
    prompt = data.draw(st.lists(pool, max_size=8))
    ids = data.draw(st.lists(pool, max_size=40))
    skip = data.draw(st.booleans())
    detok = IncrementalDetokenizer(sentencepiece, prompt, skip_special_tokens=skip)
    streamed = "".join(_stream(detok, ids)) + detok.flush()
    context = prompt[-5:]
    full = sentencepiece.decode(context + ids, skip_special_tokens=skip)
    assert sentencepiece.decode(context, skip_special_tokens=skip) + streamed == full


def test_invalid_prefix_falls_back_to_the_python_window(sentencepiece: Tokenizer) -> None:
    """`A` then the lone byte 0xAC: byte fallback turns the pair into two U+FFFD, so the
    text no longer starts with the `A` already streamed; DecodeStream refuses that and the
    Python window carries on with the very deltas it would have given alone."""
    pieces = ["<0x41>", "<0xAC>", "e", "▁the"]
    ids: list[int] = []
    for piece in pieces:
        token_id = sentencepiece.token_to_id(piece)
        assert token_id is not None, piece
        ids.append(token_id)
    rust = IncrementalDetokenizer(sentencepiece, [])
    python = IncrementalDetokenizer(_PythonOnly(sentencepiece), [])
    deltas = _stream(rust, ids)
    assert rust._stream is None  # it fell back
    assert deltas == _stream(python, ids)
    assert deltas[0] == "A"
