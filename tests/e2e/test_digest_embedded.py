"""`hydrant serve` on the embedded default runs the jobs itself: the admin digest lands in the
outbox as an `.eml`, and its unsubscribe link works against the same running server."""

from __future__ import annotations

import email
import email.policy
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from hydrant_server import hydrant_server

pytestmark = pytest.mark.slow


def test_serve_runs_the_digest_job_without_redis(demo_model_dir: Path, tmp_path: Path) -> None:
    env = {
        "HYDRANT_ADMIN_DIGEST_TO": "boss@hydrant.test",
        "HYDRANT_ADMIN_DIGEST_HOUR": "0",  # due whatever the hour the test runs at
        "HYDRANT_REDIS_URL": "",
    }
    with hydrant_server(tmp_path, demo_model_dir, env=env) as server:
        outbox = tmp_path / "outbox"
        deadline = time.monotonic() + 60
        while not list(outbox.glob("*.eml")):
            assert time.monotonic() < deadline, "no digest in the outbox"
            assert server.process.poll() is None
            time.sleep(0.2)
        [eml] = outbox.glob("*.eml")
        message = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
        assert message["To"] == "boss@hydrant.test"
        assert message["Subject"].startswith("Hydrant platform digest for ")
        link = urlsplit(message["List-Unsubscribe"].strip("<>"))
        assert f"{link.scheme}://{link.netloc}" == server.base_url  # the default public URL

        page = httpx.get(f"{server.base_url}{link.path}?{link.query}", timeout=30)
        assert page.status_code == 200 and "boss@hydrant.test" in page.text
    assert len(list(outbox.glob("*.eml"))) == 1
