"""Fixtures: the digest tests' helpers (real SMTP server, ledger factories) on sys.path."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "digests"))

from smtp_inbox import SmtpServer, smtp_server


@pytest.fixture()
def smtp(tmp_path: Path) -> Iterator[SmtpServer]:
    with smtp_server(tmp_path) as server:
        yield server
