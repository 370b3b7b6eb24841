"""Redaction holds for every path a secret or a prompt could take into a log line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from hydrant.logs import JsonFormatter, RedactionFilter, configure_logging, redact

KEY = "hyd_live_Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z0a1b2C"
PROMPT = "the canary prompt: purple elephants dance at midnight"


@pytest.fixture()
def capture() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactionFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("hydrant.test.redaction")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield stream
    logger.removeHandler(handler)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_key_in_message_args_extra_and_exception_is_masked(capture: io.StringIO) -> None:
    logger = logging.getLogger("hydrant.test.redaction")
    logger.info("auth with %s", KEY)
    logger.info("header Authorization: Bearer %s", "sk-abcdefghijklmnopqrstuvwxyz")
    logger.warning("lookup failed", extra={"key": KEY, "url": "postgresql://u:hunter22@db/x"})
    try:
        raise ValueError(f"bad key {KEY}")
    except ValueError:
        logger.exception("request failed")
    text = capture.getvalue()
    assert KEY not in text
    assert "sk-abcdefghijklmnopqrstuvwxyz" not in text
    assert "hunter22" not in text
    assert text.count("[REDACTED]") >= 4
    assert len(_lines(capture)) == 4


def test_text_fields_are_dropped_not_logged(capture: io.StringIO) -> None:
    logger = logging.getLogger("hydrant.test.redaction")
    logger.info("completed", extra={"prompt": PROMPT, "completion": PROMPT, "tokens": 12})
    (line,) = _lines(capture)
    assert PROMPT not in json.dumps(line)
    assert line["tokens"] == 12
    assert "prompt" not in line and "completion" not in line


def test_key_with_typo_is_still_masked() -> None:
    assert "Ab3dEf6" not in redact(KEY[:-1] + "X")


def test_configure_logging_installs_one_redacting_handler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        configure_logging("INFO", "json")
        configure_logging("INFO", "text")
        ours = [h for h in root.handlers if h.get_name() == "hydrant"]
        assert len(ours) == 1
        logging.getLogger("uvicorn.error").error("key %s", KEY)
        err = capsys.readouterr().err
        assert "[REDACTED]" in err and KEY not in err
    finally:
        for handler in list(root.handlers):
            if handler not in before:
                root.removeHandler(handler)
