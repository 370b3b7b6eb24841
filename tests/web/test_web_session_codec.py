"""The session cookie codec, the CSRF token and the `next` check: pure logic, no server."""

from __future__ import annotations

from hydrant.web import csrf
from hydrant.web.context import safe_next
from hydrant.web.session import (
    SESSION_LIFETIME_S,
    SessionData,
    decode_session,
    derive_key,
    encode_session,
    is_secure_request,
)

KEY = derive_key(b"s" * 32, "session")


def test_round_trip_and_expiry() -> None:
    data = SessionData.new(key_id="key_1", prefix="hyd_test_abc", scope="admin", now=1000)
    cookie = encode_session(data, KEY)
    assert decode_session(cookie, KEY, now=1001) == data
    assert decode_session(cookie, KEY, now=1000 + SESSION_LIFETIME_S) is None


def test_tampered_or_foreign_cookies_are_refused() -> None:
    data = SessionData.new(key_id="key_1", prefix="hyd_test_abc", scope="inference", now=1000)
    cookie = encode_session(data, KEY)
    version, _payload, signature = cookie.split(".")
    other = encode_session(
        SessionData(data.sid, data.key_id, data.prefix, "admin", data.expires), KEY
    )
    widened = f"{version}.{other.split('.')[1]}.{signature}"  # a scope swapped in, old signature
    assert decode_session(widened, KEY, now=1001) is None
    assert decode_session(cookie, derive_key(b"t" * 32, "session"), now=1001) is None
    assert decode_session(cookie, derive_key(b"s" * 32, "csrf"), now=1001) is None
    for junk in (None, "", "v1", "v2.a.b", "v1.!!.??", "x" * 5000):
        assert decode_session(junk, KEY, now=1001) is None


def test_csrf_token_is_bound_to_cookie_and_session() -> None:
    key = derive_key(b"s" * 32, "csrf")
    token = csrf.token_for(key, "cookie", "sid1")
    assert csrf.token_valid(key, "cookie", "sid1", token)
    assert not csrf.token_valid(key, "cookie", "sid2", token)
    assert not csrf.token_valid(key, "other", "sid1", token)
    assert not csrf.token_valid(key, None, "sid1", token)
    assert not csrf.token_valid(key, "cookie", "sid1", None)


def test_next_never_leaves_the_site() -> None:
    assert safe_next("/ui/tenants") == "/ui/tenants"
    for bad in ("https://evil.example/ui", "//evil.example/ui", "/admin/keys", "/ui\\..", None, ""):
        assert safe_next(bad) is None


def test_secure_behind_tls() -> None:
    assert is_secure_request("https", None)
    assert is_secure_request("http", "https")
    assert is_secure_request("http", "HTTPS, http")
    assert not is_secure_request("http", None)
    assert not is_secure_request("http", "http")
