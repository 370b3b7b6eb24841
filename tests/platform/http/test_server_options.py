"""`server_options`: the one set of uvicorn options `hydrant serve` and the overhead bench share."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hydrant.platform.http.server_protocol import (
    header_deadline_protocol,
    httptools_header_protocol,
    server_options,
)
from hydrant.settings import Settings

SETTINGS = replace(
    Settings(), max_header_bytes=4096, keep_alive_timeout_s=3, header_read_timeout_s=7.0
)


def test_the_options_carry_the_settings_limits_and_the_httptools_protocol() -> None:
    options = server_options(SETTINGS)
    assert options["h11_max_incomplete_event_size"] == 4096
    assert options["timeout_keep_alive"] == 3
    protocol = options["http"]
    assert issubclass(protocol, HttpToolsProtocol)  # httptools is installed: the cheaper parser
    assert protocol.__name__ == "HeaderDeadlineHttpToolsProtocol"
    assert options["server_header"] is False
    assert options["proxy_headers"] is False  # forwarded headers are client_address.py's
    assert options["access_log"] is False
    assert options["log_config"] is None  # logging is hydrant's own (redacted)
    assert options["loop"] == "uvloop"  # a runtime dependency off Windows


def test_without_uvloop_the_gateway_runs_on_asyncios_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` now fails
    assert server_options(SETTINGS)["loop"] == "asyncio"


def test_without_httptools_the_options_fall_back_to_the_h11_protocol(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "httptools", None)  # `import httptools` now fails
    protocol = server_options(SETTINGS)["http"]
    assert issubclass(protocol, H11Protocol)
    assert protocol.__name__ == "HeaderDeadlineH11Protocol"


@pytest.mark.parametrize(
    "make", [header_deadline_protocol, lambda t: httptools_header_protocol(t, 4096)]
)
def test_a_header_timeout_must_be_positive(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="header timeout"):
        make(0)
