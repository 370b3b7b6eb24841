"""Key hashing: HMAC under the server secret, constant-time verify, the dummy path."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, cast

import pytest

from hydrant.platform.keys import generate_key, hash_key, verify_against_dummy, verify_key

SERVER_SECRET = b"0123456789abcdef0123456789abcdef"


def test_hash_is_hex_hmac_sha256_of_the_whole_key() -> None:
    secret = generate_key().secret
    expected = hmac.new(SERVER_SECRET, secret.encode(), hashlib.sha256).hexdigest()
    assert hash_key(secret, SERVER_SECRET) == expected
    assert len(expected) == 64


def test_verify_accepts_the_right_key_only() -> None:
    key, other = generate_key(), generate_key()
    stored = hash_key(key.secret, SERVER_SECRET)
    assert verify_key(key.secret, stored, SERVER_SECRET)
    assert not verify_key(other.secret, stored, SERVER_SECRET)


def test_hash_depends_on_the_server_secret() -> None:
    key = generate_key()
    stored = hash_key(key.secret, SERVER_SECRET)
    assert not verify_key(key.secret, stored, b"another-secret-of-32-bytes-long!")


@pytest.mark.parametrize("stored", ["", "zz", "é" * 64, "0" * 63])
def test_garbage_stored_hash_is_a_clean_false(stored: str) -> None:
    assert not verify_key(generate_key().secret, stored, SERVER_SECRET)


def test_dummy_path_is_always_false() -> None:
    key = generate_key()
    assert verify_against_dummy(key.secret, SERVER_SECRET) is False


def test_dummy_path_does_the_same_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same HMAC and the same compare_digest call on equal-length inputs: equal cost."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    key = generate_key()
    verify_key(key.secret, hash_key(key.secret, SERVER_SECRET), SERVER_SECRET)
    verify_against_dummy(key.secret, SERVER_SECRET)
    assert calls == [(64, 64), (64, 64)]


def test_short_or_text_server_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        hash_key("x", b"short")
    with pytest.raises(TypeError, match="bytes"):
        hash_key("x", cast(Any, "a-text-secret-of-enough-length"))
