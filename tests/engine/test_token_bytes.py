"""A token's raw bytes (OpenAI logprobs' `bytes`): for byte-level BPE (the demo tokenizer,
Llama 3 style) and a SentencePiece-style BPE with byte fallback (Llama 2 / Mistral style), the
bytes of a text's tokens, joined, are the text's UTF-8, also where a character is split
across tokens and no single token is valid UTF-8."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sp_tokenizer import write_sentencepiece_style
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import models

from hydrant.engine.demo_model import EOS_TOKEN, write_demo_tokenizer
from hydrant.engine.token_bytes import _UNICODE_TO_BYTE, decoder_scheme
from hydrant.engine.tokenizer import Tokenizer

SPLIT_TEXTS = ["你好，世界", "naïve café 🙂🚀", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and ASCII", "Ünïcödé\n\tend"]


def _broken_alone(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    out = tmp_path_factory.mktemp("byte-level")
    write_demo_tokenizer(out)
    return Tokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return Tokenizer.from_pretrained(write_sentencepiece_style(tmp_path_factory.mktemp("sp")))


def test_the_byte_table_is_gpt2s() -> None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    gpt2 = {char: byte for byte, char in bytes_to_unicode().items()}
    assert gpt2 == _UNICODE_TO_BYTE


def test_each_tokenizer_is_read_as_its_decoder_says(
    byte_level: Tokenizer, sentencepiece: Tokenizer
) -> None:
    assert decoder_scheme(byte_level._backend) == "byte_level"
    assert decoder_scheme(sentencepiece._backend) == "sentencepiece"
    bare = BackendTokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert decoder_scheme(bare) == "decoded"


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_byte_level_tokens_rebuild_split_characters(byte_level: Tokenizer, text: str) -> None:
    ids = byte_level.encode(text, add_special_tokens=False)
    pieces = [byte_level.token_bytes(i) for i in ids]
    assert b"".join(pieces) == text.encode()
    assert byte_level.decode(ids).encode() == text.encode()


def test_the_split_case_is_exercised(byte_level: Tokenizer, sentencepiece: Tokenizer) -> None:
    """Some token of the texts is a piece of a character: its decode alone is U+FFFD, whose
    UTF-8 is not its bytes (what `bytes` carried before it was read from the vocabulary)."""
    for tokenizer in (byte_level, sentencepiece):
        ids = [i for text in SPLIT_TEXTS for i in tokenizer.encode(text, add_special_tokens=False)]
        broken = [i for i in ids if _broken_alone(tokenizer.token_bytes(i))]
        assert broken, "no token of the texts splits a character"
        assert all("\ufffd" in tokenizer.decode([i]) for i in broken)


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_sentencepiece_tokens_rebuild_text_and_keep_leading_spaces(
    sentencepiece: Tokenizer, text: str
) -> None:
    ids = sentencepiece.encode(text, add_special_tokens=False)
    joined = b"".join(sentencepiece.token_bytes(i) for i in ids)
    # The normalizer prepends one space mark; decoding strips that one space, the bytes keep it.
    assert joined == b" " + text.encode()
    assert sentencepiece.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=40))
def test_any_text_round_trips_through_token_bytes(byte_level: Tokenizer, text: str) -> None:
    ids = byte_level.encode(text, add_special_tokens=False)
    assert b"".join(byte_level.token_bytes(i) for i in ids) == text.encode()


def test_special_and_unknown_tokens(byte_level: Tokenizer, sentencepiece: Tokenizer) -> None:
    eos = byte_level.token_to_id(EOS_TOKEN)
    assert eos is not None and byte_level.token_bytes(eos) == EOS_TOKEN.encode()
    assert sentencepiece.token_bytes(2) == b"</s>"
    assert sentencepiece.token_bytes(3) == b"\x00"  # <0x00>
    assert byte_level.token_bytes(10**9) == b""
