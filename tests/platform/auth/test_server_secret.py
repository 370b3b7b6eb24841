"""The server secret and the start-up checks: made once, kept private, refused when unusable."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hydrant.errors import ConfigurationError
from hydrant.platform.app import create_app
from hydrant.platform.auth.from_settings import cache_ttl
from hydrant.platform.server_secret import load_server_secret, secret_file
from hydrant.settings import load_settings


def test_embedded_secret_is_generated_once_with_mode_0600(data_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir)
    first = load_server_secret(settings)
    path = secret_file(settings)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first) >= 32
    assert load_server_secret(settings) == first
    assert [p.name for p in data_dir.iterdir()] == ["secret.key"]  # no temporary left behind


def test_configured_secret_wins_and_touches_no_file(data_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir, secret_key="s" * 32)
    assert load_server_secret(settings) == b"s" * 32
    assert not secret_file(settings).exists()


def test_short_secrets_are_refused(data_dir: Path) -> None:
    with pytest.raises(ConfigurationError, match="at least 16 bytes"):
        load_server_secret(load_settings({}, data_dir=data_dir, secret_key="short"))
    settings = load_settings({}, data_dir=data_dir)
    secret_file(settings).write_text("tiny")
    with pytest.raises(ConfigurationError, match="too short"):
        load_server_secret(settings)


def test_building_the_app_touches_no_file(data_dir: Path) -> None:
    create_app(load_settings({}, data_dir=data_dir))
    assert list(data_dir.iterdir()) == []


def test_malformed_bootstrap_key_is_a_configuration_error(data_dir: Path) -> None:
    settings = load_settings({}, data_dir=data_dir, admin_bootstrap_key="hyd_live_nope")
    with pytest.raises(ConfigurationError, match="HYDRANT_ADMIN_BOOTSTRAP_KEY") as caught:
        create_app(settings)
    assert "hyd_live_nope" not in str(caught.value)  # even a wrong key is not echoed


@pytest.mark.parametrize(("raw", "ok"), [("2.5", True), ("0", False), ("60", False), ("x", False)])
def test_cache_ttl_setting(raw: str, ok: bool) -> None:
    if ok:
        assert cache_ttl(load_settings({"HYDRANT_KEY_CACHE_TTL_S": raw})) == 2.5
        return
    with pytest.raises(ConfigurationError, match="HYDRANT_KEY_CACHE_TTL_S"):
        cache_ttl(load_settings({"HYDRANT_KEY_CACHE_TTL_S": raw}))
