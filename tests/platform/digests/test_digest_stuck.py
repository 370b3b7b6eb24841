"""Digest sends a worker left `sending`: listed after 15 minutes, re-sent only by a person.

Against a real SMTP server (aiosmtpd) for the service, and the admin API on
SQLite and PostgreSQL; the claims are real rows the service itself wrote.
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from control_plane_helpers import ControlPlane, bearer, control_plane
from digest_factories import DAY
from smtp_inbox import SmtpServer
from sqlalchemy import select
from test_digest_mail import send_cut_short, service

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import DigestSend
from hydrant.platform.db.session import Database
from hydrant.platform.digests.service import STUCK_AFTER
from hydrant.platform.errors import Conflict, NotFound

LATER = STUCK_AFTER + timedelta(minutes=1)


async def _claims(db: Database) -> list[DigestSend]:
    async with db.session() as session:
        return list(await session.scalars(select(DigestSend)))


async def test_a_send_cut_short_is_stuck_after_the_window_and_a_resend_mails_it_once(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world, settings = await send_cut_short(db, smtp, data_dir)
    digests = service(db, settings)
    [claim] = await _claims(db)
    assert claim.status == "sending"

    assert await digests.stuck_sends(now=utcnow()) == []  # it may still be sending
    with pytest.raises(Conflict) as young:
        await digests.resend_stuck(claim.id, now=utcnow())
    assert young.value.code == "digest_send_in_progress"
    assert smtp.inbox.count() == 1

    [stuck] = await digests.stuck_sends(now=utcnow() + LATER)
    assert (stuck.id, stuck.kind, stuck.subject_id, stuck.day) == (
        claim.id,
        "tenant",
        world.tenant_id,
        DAY,
    )
    result = await digests.resend_stuck(claim.id, now=utcnow() + LATER)
    assert (result.outcome, result.recipients) == ("sent", 1)
    assert smtp.inbox.count() == 2  # the person chose the duplicate over a missing digest

    [after] = await _claims(db)
    assert after.status == "sent" and after.id != claim.id  # a new claim, recorded as sent
    assert await digests.stuck_sends(now=utcnow() + LATER) == []
    with pytest.raises(NotFound):  # the old claim is gone: a second click resends nothing
        await digests.resend_stuck(claim.id, now=utcnow() + LATER)
    with pytest.raises(Conflict) as finished:
        await digests.resend_stuck(after.id, now=utcnow() + LATER)
    assert finished.value.code == "digest_not_stuck"
    assert smtp.inbox.count() == 2


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane


async def test_the_admin_api_lists_and_resends_stuck_sends(
    cp: ControlPlane, db: Database, data_dir: Path
) -> None:
    tenant, tenant_secret = await cp.tenant_with_key("acme")
    put = await cp.client.put(
        f"/admin/tenants/{tenant['id']}/digest",
        json={"recipients": ["ops@acme.test"]},
        headers=cp.admin,
    )
    assert put.status_code == 200
    async with db.session() as session:  # what a worker that died mid-send leaves behind
        old = DigestSend(
            kind="tenant",
            subject_id=tenant["id"],
            day=DAY,
            status="sending",
            claimed_at=utcnow() - LATER,
        )
        fresh = DigestSend(
            kind="tenant", subject_id=tenant["id"], day=DAY - timedelta(days=1), status="sending"
        )
        session.add_all([old, fresh])
    path = "/admin/digests/stuck"

    assert (await cp.client.get(path)).status_code == 401
    assert (await cp.client.get(path, headers=bearer(tenant_secret))).status_code in (401, 403)
    refused = await cp.client.post(f"{path}/{old.id}/resend", headers=bearer(tenant_secret))
    assert refused.status_code in (401, 403)

    listed = await cp.client.get(path, headers=cp.admin)
    assert listed.status_code == 200
    [row] = listed.json()["data"]
    assert (row["object"], row["id"], row["kind"], row["subject_id"], row["day"]) == (
        "digest_send",
        old.id,
        "tenant",
        tenant["id"],
        DAY.isoformat(),
    )

    busy = await cp.client.post(f"{path}/{fresh.id}/resend", headers=cp.admin)
    assert busy.status_code == 409
    assert busy.json()["error"]["code"] == "digest_send_in_progress"
    missing = await cp.client.post(f"{path}/dgs_nope/resend", headers=cp.admin)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "send_id"

    resent = await cp.client.post(f"{path}/{old.id}/resend", headers=cp.admin)
    assert resent.status_code == 200, resent.text
    assert resent.json() == {
        "object": "digest_resend",
        "id": old.id,
        "outcome": "sent",
        "recipients": 1,
    }
    [eml] = (data_dir / "outbox").glob("*.eml")  # the embedded mailer's outbox
    message = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
    assert message["To"] == "ops@acme.test"
    assert (await cp.client.get(path, headers=cp.admin)).json()["data"] == []
    again = await cp.client.post(f"{path}/{old.id}/resend", headers=cp.admin)
    assert again.status_code == 404
