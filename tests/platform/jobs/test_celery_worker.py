"""Celery with a real worker (`hydrant jobs worker`, a subprocess) on the test Redis, DB 5.

Not `task_always_eager`: tasks cross Redis, run in another process on their
own event loop, and mail a real SMTP server in this process. A digest task
delivered twice, a dispatcher fired twice, and a task retried after the mail
server refused it each leave exactly one mail.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from digest_factories import DAY, make_ledger, make_world, random_traffic
from smtp_inbox import SmtpServer
from sqlalchemy import select

from hydrant.platform.db.models import DigestSend, DigestSettings
from hydrant.platform.db.session import Database
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.celery_app import make_celery
from hydrant.settings import Settings, load_settings

pytestmark = pytest.mark.integration

RESULT_TIMEOUT_S = 120  # worker start-up (imports) on a busy machine, then the task
SECRET = "celery-test-secret-0123456789abcdef"


@pytest.fixture()
def broker_url(redis_url: str) -> Iterator[str]:
    """Redis DB 5: this suite's own database, emptied before and after."""
    url = redis_url.rsplit("/", 1)[0] + "/5"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


@pytest.fixture()
def job_settings(broker_url: str, database_url: str, smtp: SmtpServer, data_dir: Path) -> Settings:
    return load_settings(
        {},
        data_dir=data_dir,
        database_url=database_url,
        redis_url=broker_url,
        smtp_url=smtp.url(),
        secret_key=SECRET,
        public_url="https://hydrant.example",
    )


@pytest.fixture()
def worker(job_settings: Settings, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {
        **os.environ,
        "HYDRANT_DATA_DIR": str(job_settings.data_dir),
        "HYDRANT_DATABASE_URL": str(job_settings.database_url),
        "HYDRANT_REDIS_URL": str(job_settings.redis_url),
        "HYDRANT_SMTP_URL": str(job_settings.smtp_url),
        "HYDRANT_SECRET_KEY": SECRET,
        "HYDRANT_LOG_FORMAT": "text",
    }
    log = (tmp_path / "worker.log").open("wb")
    hydrant = Path(sys.executable).parent / "hydrant"
    process = subprocess.Popen(
        [str(hydrant), "jobs", "worker", "--pool", "solo", "--loglevel", "WARNING"],
        cwd=tmp_path,  # not the repository root: `platform/` must not shadow the stdlib
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def wait(results: list[Any]) -> list[Any]:
    return [r.get(timeout=RESULT_TIMEOUT_S) for r in results]


async def sends(database_url: str) -> list[tuple[str, str]]:
    database = Database(database_url)
    try:
        async with database.session() as session:
            rows = await session.scalars(select(DigestSend).order_by(DigestSend.day))
            return [(r.day.isoformat(), r.status) for r in rows]
    finally:
        await database.dispose()


async def prepare(settings: Settings) -> str:
    database = Database(str(settings.database_url))
    try:
        world = await make_world(database, recipients=["ops@acme.test"])
        await random_traffic(make_ledger(database, settings.data_dir), world)
        async with database.session() as session:  # due whatever the hour the test runs at
            session.add(DigestSettings(tenant_id=world.tenant_id, send_hour=0, timezone="UTC"))
        return world.tenant_id
    finally:
        await database.dispose()


def test_tasks_delivered_twice_or_retried_mail_once(
    job_settings: Settings, worker: subprocess.Popen[bytes], smtp: SmtpServer
) -> None:
    tenant_id = asyncio.run(prepare(job_settings))
    app = make_celery(job_settings, JOB_TABLE)
    kwargs = {"tenant_id": tenant_id, "day": DAY.isoformat()}

    results = wait([app.send_task("hydrant.digests.send_tenant", kwargs=kwargs) for _ in range(2)])

    assert sorted(r["outcome"] for r in results) == ["already_sent", "sent"]
    assert smtp.inbox.count() == 1
    [message] = smtp.inbox.to("ops@acme.test")
    assert message["Subject"] == f"Hydrant usage for acme on {DAY.isoformat()}"
    assert worker.poll() is None

    # Beat's dispatcher, fired twice: yesterday's digest (UTC, send hour 0) goes out once.
    wait([app.send_task("hydrant.digests.dispatch") for _ in range(2)])
    # The solo worker runs its queue in order: once this marker is done, so are the
    # sends the two dispatches enqueued before it.
    wait([app.send_task("hydrant.ledger.rollup")])
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    expected = {DAY.isoformat(), yesterday.isoformat()}  # one day if the test runs on Dec 1
    days = asyncio.run(sends(str(job_settings.database_url)))
    assert sorted(days) == sorted((day, "sent") for day in expected)
    assert smtp.inbox.count() == len(expected)

    # A task whose mail the server refused (451) is retried by Celery and mails once.
    smtp.inbox.refuse_next = 1
    earlier = {"tenant_id": tenant_id, "day": (DAY - timedelta(days=1)).isoformat()}
    [result] = wait([app.send_task("hydrant.digests.send_tenant", kwargs=earlier)])
    assert result == {"outcome": "sent", "recipients": 1}
    assert smtp.inbox.refuse_next == 0  # the refusal did happen
    assert smtp.inbox.count() == len(expected) + 1


def test_beat_starts_with_the_schedule_from_settings(
    broker_url: str, data_dir: Path, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "HYDRANT_DATA_DIR": str(data_dir),
        "HYDRANT_REDIS_URL": broker_url,
        "HYDRANT_LOG_FORMAT": "text",
    }
    hydrant = Path(sys.executable).parent / "hydrant"
    log_path = tmp_path / "beat.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(hydrant), "jobs", "beat", "--loglevel", "INFO"],
            cwd=tmp_path,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + RESULT_TIMEOUT_S
            while not list(data_dir.glob("celerybeat-schedule*")):
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "beat did not start"
                time.sleep(0.2)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    assert "beat: Starting" in log_path.read_text()
