"""The key format: generation, parsing without I/O, the scanner pattern, redaction."""

from __future__ import annotations

from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hydrant.platform.auth.base62 import ALPHABET, encode_fixed
from hydrant.platform.auth.key_codec import KEY_LENGTH
from hydrant.platform.keys import (
    KEY_PATTERN,
    MalformedKeyError,
    generate_key,
    parse_key,
    redact_keys,
)


@pytest.mark.parametrize("env", ["live", "test"])
def test_generated_key_parses_back_with_its_prefix(env: str) -> None:
    key = generate_key(cast(Any, env))
    assert key.secret.startswith(f"hyd_{env}_")
    assert len(key.secret) == KEY_LENGTH == 47
    assert key.prefix == key.secret[: len(f"hyd_{env}_") + 8]
    parsed = parse_key(key.secret)
    assert parsed.env == env
    assert parsed.prefix == key.prefix
    assert parsed.secret == key.secret


def test_keys_are_unique_and_use_only_base62() -> None:
    secrets = {generate_key().secret for _ in range(200)}
    assert len(secrets) == 200
    for secret in secrets:
        assert set(secret.split("_", 2)[2]) <= set(ALPHABET)


def test_unknown_environment_is_refused() -> None:
    with pytest.raises(ValueError, match="environment"):
        generate_key(cast(Any, "prod"))


def test_repr_never_shows_the_secret() -> None:
    key = generate_key()
    assert key.secret not in repr(key)
    assert key.secret not in repr(parse_key(key.secret))


def _flip(text: str, index: int) -> str:
    replacement = "A" if text[index] != "A" else "B"
    return text[:index] + replacement + text[index + 1 :]


@pytest.mark.parametrize("index", [9, 20, 40, 41, 46])
def test_any_changed_character_fails_the_checksum(index: int) -> None:
    secret = generate_key().secret
    with pytest.raises(MalformedKeyError, match="checksum"):
        parse_key(_flip(secret, index))


def test_switching_the_environment_fails_the_checksum() -> None:
    secret = generate_key("test").secret
    with pytest.raises(MalformedKeyError, match="checksum"):
        parse_key(secret.replace("hyd_test_", "hyd_live_", 1))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hyd_live_",
        "sk-" + "a" * 44,
        "hyd_prod_" + "a" * 38,
        "hyd_live_" + "a" * 37 + "!",
        "HYD_live_" + "a" * 38,
        "hyd_live_" + "a" * 39,
        "x" * 10_000,
    ],
)
def test_malformed_text_is_refused_and_not_echoed(text: str) -> None:
    with pytest.raises(MalformedKeyError) as info:
        parse_key(text)
    if text:
        assert text not in str(info.value)


def test_non_string_is_malformed() -> None:
    with pytest.raises(MalformedKeyError):
        parse_key(cast(Any, b"hyd_live_x"))


def test_pattern_finds_keys_in_free_text_but_not_glued_ones() -> None:
    a, b = generate_key("live").secret, generate_key("test").secret
    text = f"Authorization: Bearer {a}, also api_key={b}; not x{a} nor {b}x"
    assert [m.group(0) for m in KEY_PATTERN.finditer(text)] == [a, b]


def test_redaction_keeps_only_the_public_prefix() -> None:
    key = generate_key()
    out = redact_keys(f"got key {key.secret} from client")
    assert key.secret not in out
    assert out == f"got key {key.prefix}… from client"


def test_base62_fixed_width_bounds() -> None:
    assert encode_fixed(0, 3) == "000"
    assert encode_fixed(61, 2) == "0z"
    assert encode_fixed(2**32 - 1, 6) == "4gfFC3"
    with pytest.raises(ValueError):
        encode_fixed(62**2, 2)
    with pytest.raises(ValueError):
        encode_fixed(-1, 4)


@given(st.text(max_size=60))
def test_parse_never_raises_anything_but_malformed(text: str) -> None:
    try:
        parse_key(text)
    except MalformedKeyError:
        return
    assert KEY_PATTERN.fullmatch(text)
