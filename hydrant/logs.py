"""Structured logging with redaction installed before the first record is written.

Two promises hold for every record, whoever emits it (our code, uvicorn,
SQLAlchemy, Celery): API keys never appear (anything shaped like a key or a
bearer token is masked in the message, its arguments, extra fields and
exception text), and prompt or completion text never appears (fields with
those names are dropped, and our code never puts text into a message).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# Broad on purpose: redaction must catch keys of any environment and near-misses
# (a key with a typo or cut short is still a secret); the strict format lives with
# the keys domain. The public display prefix (`hyd_live_` + 8 characters) stays
# readable, since logs identify keys by it.
SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"hyd_[A-Za-z0-9]+_[A-Za-z0-9]{12,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"sk-[A-Za-z0-9_-]{16,}"),
    re.compile(
        r"(?i)((?:password|passwd|secret|token|api[_-]?key)[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"
    ),
    re.compile(r"(?i)(://[^:/@\s]+:)[^@\s]+(@)"),
)
REDACTED = "[REDACTED]"

# Record attributes that may carry user text; they are removed, not masked.
TEXT_FIELDS = frozenset(
    {"prompt", "prompts", "messages", "completion", "content", "text", "input", "output", "body"}
)

_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def redact(text: str) -> str:
    """Mask every secret-shaped substring of `text`."""
    for pattern in SECRET_PATTERNS:
        if pattern.groups >= 1:
            text = pattern.sub(
                lambda m: m.group(1) + REDACTED + (m.group(2) if m.re.groups >= 2 else ""), text
            )
        else:
            text = pattern.sub(REDACTED, text)
    return text


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, int | float | bool) or value is None:
        return value
    return redact(repr(value))


class RedactionFilter(logging.Filter):
    """Rewrites records in place so no handler can see a secret or user text."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg = redact(message)
        record.args = None
        for name in list(vars(record)):
            if name in _STANDARD_ATTRS:
                continue
            if name.lower() in TEXT_FIELDS:
                delattr(record, name)
            else:
                setattr(record, name, _redact_value(getattr(record, name)))
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD_ATTRS and not name.startswith("_"):
                payload[name] = value
        if record.exc_text:
            payload["exc"] = record.exc_text
        return json.dumps(payload, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """Human-readable lines for a terminal, extra fields appended as key=value."""

    def format(self, record: logging.LogRecord) -> str:
        extras = " ".join(
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _STANDARD_ATTRS and not k.startswith("_")
        )
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.name}: "
        line = base + record.getMessage() + (f"  {extras}" if extras else "")
        if record.exc_text:
            line += "\n" + record.exc_text
        return line


def configure_logging(
    level: str = "INFO", fmt: str = "json", log_file: Path | None = None
) -> logging.Handler:
    """Install one redacting handler on the root logger (idempotent) and return it."""
    root = logging.getLogger()
    for existing in list(root.handlers):
        if existing.get_name() == "hydrant":
            root.removeHandler(existing)
    handler: logging.Handler
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.set_name("hydrant")
    handler.addFilter(RedactionFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "alembic", "celery"):
        # Their own handlers would bypass ours (and our filter): route them to the root.
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # httpx logs each request at INFO: the gateway's calls to workers and upstream servers
    # (health probes every few seconds, one per request) would drown the log.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, root.level))
    return handler
