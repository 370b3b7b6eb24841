"""`server_options`: the one set of uvicorn options `hydrant serve` and the overhead bench share."""

from __future__ import annotations

from dataclasses import replace

from uvicorn.protocols.http.h11_impl import H11Protocol

from hydrant.platform.http.server_protocol import server_options
from hydrant.settings import Settings


def test_the_options_carry_the_settings_limits_and_the_deadline_protocol() -> None:
    settings = replace(
        Settings(), max_header_bytes=4096, keep_alive_timeout_s=3, header_read_timeout_s=7.0
    )
    options = server_options(settings)
    assert options["h11_max_incomplete_event_size"] == 4096
    assert options["timeout_keep_alive"] == 3
    protocol = options["http"]
    assert issubclass(protocol, H11Protocol)
    assert protocol.__name__ == "HeaderDeadlineH11Protocol"
    assert options["server_header"] is False
    assert options["access_log"] is False
    assert options["log_config"] is None  # logging is hydrant's own (redacted)
