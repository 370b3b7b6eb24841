"""Fixtures: a real SMTP server, and the helpers of the digests and auth tests on sys.path
(the ledger factories and the control plane are theirs)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "digests"))
sys.path.insert(0, str(HERE.parent / "auth"))

from smtp_inbox import SmtpServer, smtp_server  # noqa: E402


@pytest.fixture()
def smtp(tmp_path: Path) -> Iterator[SmtpServer]:
    with smtp_server(tmp_path) as server:
        yield server
