from __future__ import annotations

from pathlib import Path

import pytest

from hydrant.errors import ConfigurationError
from hydrant.settings import ModelSpec, Settings, UpstreamSpec, load_settings


def test_defaults_are_the_embedded_mode(tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path)
    assert settings.embedded
    assert settings.effective_database_url == f"sqlite+aiosqlite:///{tmp_path.resolve()}/hydrant.db"
    assert settings.effective_outbox_dir == tmp_path / "outbox"
    assert settings.served_models() == (ModelSpec("demo", tmp_path / "models" / "demo"),)


def test_environment_is_read_and_typed() -> None:
    env = {
        "HYDRANT_PORT": "9001",
        "HYDRANT_REDIS_URL": "redis://127.0.0.1:6379/3",
        "HYDRANT_MODELS": "llama=/m/llama, qwen=/m/qwen",
        "HYDRANT_AUTO_MIGRATE": "false",
        "HYDRANT_KV_CACHE_BYTES": "1048576",
        "UNRELATED": "x",
    }
    settings = load_settings(env)
    assert settings.port == 9001
    assert settings.redis_url == "redis://127.0.0.1:6379/3"
    assert [m.name for m in settings.models] == ["llama", "qwen"]
    assert settings.models[1].path == Path("/m/qwen")
    assert settings.auto_migrate is False
    assert settings.kv_cache_bytes == 1048576
    assert not settings.embedded


def test_toml_file_then_environment_then_overrides(tmp_path: Path) -> None:
    config = tmp_path / "hydrant.toml"
    config.write_text(
        '[hydrant]\nport = 7000\nhost = "0.0.0.0"\n'
        'models = [{name = "a", path = "/x"}]\nlog_format = "text"\n'
    )
    settings = load_settings({"HYDRANT_PORT": "7001"}, config_file=config, host="::1")
    assert settings.port == 7001
    assert settings.host == "::1"
    assert settings.log_format == "text"
    assert settings.models == (ModelSpec("a", Path("/x")),)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HYDRANT_PORT": "eighty"}, "HYDRANT_PORT"),
        ({"HYDRANT_PORT": "70000"}, "out of range"),
        ({"HYDRANT_AUTO_MIGRATE": "maybe"}, "true or false"),
        ({"HYDRANT_REDIS_FAILURE_MODE": "sideways"}, "closed, open"),
        ({"HYDRANT_MODELS": "no-equals-sign"}, "NAME=PATH"),
        ({"HYDRANT_TOOL_CALL_PARSERS": "demo=xml"}, "MODEL=PARSER"),
        ({"HYDRANT_TOOL_CALL_PARSERS": "hermes"}, "MODEL=PARSER"),
        ({"HYDRANT_TOOL_CALL_PARSERS": "qwen=hermes"}, "qwen, which is not served"),
        ({"HYDRANT_POOL_BACKENDS": "demo=grpc:http://h:1"}, "MODEL=KIND:URL"),
        ({"HYDRANT_POOL_BACKENDS": "demo=openai:"}, "MODEL=KIND:URL"),
        ({"HYDRANT_POOL_BACKENDS": "demo=openai:h:8000"}, "not an http"),
        ({"HYDRANT_POOL_BACKENDS": "big=openai:http://h:8000"}, "big, which is not served"),
        ({"HYDRANT_INVOICE_ISSUER": "hyd-1"}, "HYDRANT_INVOICE_ISSUER"),
    ],
)
def test_bad_values_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        load_settings(env)


def test_unknown_toml_keys_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[hydrant]\nprot = 1\n")
    with pytest.raises(ConfigurationError, match="prot"):
        load_settings({}, config_file=config)


def test_nothing_is_read_at_import_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYDRANT_PORT", "1234")
    assert Settings().port == 8000
    assert load_settings().port == 1234


def test_tool_call_parsers_are_per_served_model() -> None:
    settings = load_settings(
        {
            "HYDRANT_MODELS": "llama=/m/llama,qwen=/m/qwen,other=/m/other",
            "HYDRANT_TOOL_CALL_PARSERS": " qwen=hermes, llama = none,",
        }
    )
    assert settings.tool_call_parser("qwen") == "hermes"
    assert settings.tool_call_parser("llama") == "none"
    assert settings.tool_call_parser("other") is None  # the template decides


def test_pool_backends_name_upstream_servers_per_model_and_a_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "upstream.key"
    key_file.write_text("sk-upstream-1\n")
    settings = load_settings(
        {
            "HYDRANT_MODELS": "big=/m/big,small=/m/small",
            "HYDRANT_POOL_BACKENDS": "big=openai:http://v1:8000/, https://v2:8000",
            "HYDRANT_UPSTREAM_API_KEY_FILE": str(key_file),
        }
    )
    assert settings.upstream_pools() == {
        "big": UpstreamSpec(model="big", kind="openai", urls=("http://v1:8000", "https://v2:8000"))
    }
    assert settings.pool_mode and not settings.worker_pools
    assert settings.upstream_key() == "sk-upstream-1"
    assert "sk-upstream" not in repr(load_settings({"HYDRANT_UPSTREAM_API_KEY": "sk-upstream-2"}))
    assert not load_settings({}).pool_mode
    missing = load_settings({"HYDRANT_UPSTREAM_API_KEY_FILE": str(tmp_path / "none")})
    with pytest.raises(ConfigurationError, match="UPSTREAM_API_KEY_FILE"):
        missing.upstream_key()
