"""Pure logic beside the real-service tests: tokens, SMTP URLs, local days, due digests."""

from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from hydrant.errors import ConfigurationError
from hydrant.platform.digests.figures import change_percent, local_day_window
from hydrant.platform.digests.unsubscribe import make_token, read_token
from hydrant.platform.errors import InvalidRequest
from hydrant.platform.job_table import JOB_TABLE
from hydrant.platform.jobs.celery_app import make_celery
from hydrant.platform.mail.mailer import OutboxMailer, SmtpMailer, make_mailer
from hydrant.settings import load_settings

SECRET = b"unit-secret-0123456789abcdef0123"


def test_unsubscribe_tokens_round_trip_and_refuse_tampering() -> None:
    token = make_token(SECRET, "ten_1", "a@b.test")
    who = read_token(SECRET, token)
    assert (who.scope, who.email) == ("ten_1", "a@b.test")
    other = make_token(SECRET, "ten_2", "a@b.test")
    forged = token.split(".")[0] + "." + other.split(".")[1]  # someone else's signature
    for bad in (forged, token[:-2], "nodot", "", "a.b", make_token(b"x" * 32, "ten_1", "a@b.test")):
        with pytest.raises(InvalidRequest):
            read_token(SECRET, bad)


def test_smtp_urls() -> None:
    starttls = SmtpMailer.from_url("smtp://u%40x:p%2Fw@mail.test")
    assert (starttls.host, starttls.port, starttls.tls) == ("mail.test", 587, "starttls")
    assert (starttls.username, starttls.password) == ("u@x", "p/w")
    implicit = SmtpMailer.from_url("smtps://mail.test")
    assert (implicit.port, implicit.tls, implicit.username) == (465, "implicit", None)
    plain = SmtpMailer.from_url("smtp://relay.test:25?tls=none&cafile=/ca.pem")
    assert (plain.port, plain.tls, plain.cafile) == (25, "none", "/ca.pem")
    for bad in ("http://mail.test", "smtp://", "smtp://h:99999", "smtp://h?tls=maybe"):
        with pytest.raises(ConfigurationError):
            SmtpMailer.from_url(bad)


def test_embedded_mail_goes_to_the_outbox(tmp_path) -> None:  # type: ignore[no-untyped-def]
    mailer = make_mailer(load_settings({}, data_dir=tmp_path))
    assert mailer == OutboxMailer(tmp_path / "outbox")


def test_local_days_follow_the_zone_and_dst() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    start, end = local_day_window(date(2026, 3, 29), berlin)  # clocks go forward: 23 hours
    assert start == datetime(2026, 3, 28, 23, tzinfo=UTC)
    assert (end - start).total_seconds() == 23 * 3600
    start, end = local_day_window(date(2026, 10, 25), berlin)  # and back: 25 hours
    assert (end - start).total_seconds() == 25 * 3600
    kolkata_start, _ = local_day_window(date(2026, 1, 1), ZoneInfo("Asia/Kolkata"))
    assert kolkata_start == datetime(2025, 12, 31, 18, 30, tzinfo=UTC)


def test_change_percent() -> None:
    from decimal import Decimal

    assert change_percent(Decimal(150), Decimal(100)) == Decimal(50)
    assert change_percent(Decimal(1), Decimal(0)) is None


def test_celery_needs_redis_and_is_built_from_settings(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match="HYDRANT_REDIS_URL"):
        make_celery(load_settings({}, data_dir=tmp_path), JOB_TABLE)
    settings = load_settings({}, data_dir=tmp_path, redis_url="redis://127.0.0.1:1/5")
    app = make_celery(settings, JOB_TABLE)
    assert app.conf.broker_url == "redis://127.0.0.1:1/5"
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    assert not app.conf.task_always_eager
    assert {"hydrant.digests.send_tenant", "hydrant.budgets.check"} <= set(app.tasks)
    schedule = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert schedule == {
        "hydrant.digests.dispatch",
        "hydrant.budgets.check",
        "hydrant.credits.check_low_balance",
        "hydrant.credits.pay_pending",
        "hydrant.invoices.finalize",
        "hydrant.ledger.rollup",
        "hydrant.adapters.hosting_fees",
        "hydrant.ledger.replay_spool",
        "hydrant.pools.reap",
        "hydrant.responses.purge",
        "hydrant.files.purge",
        "hydrant.batches.sweep",
        "hydrant.billing.export_usage",
        "hydrant.billing.reconcile",
        "hydrant.billing.purge_usage_export",
        "hydrant.billing.purge_reconciliation",
    }
