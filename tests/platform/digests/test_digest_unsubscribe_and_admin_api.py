"""The admin route for digest settings, and unsubscribing through the link in a real mail."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from control_plane_helpers import SERVER_SECRET, ControlPlane, bearer, control_plane
from digest_factories import DAY, SEND_AT
from smtp_inbox import SmtpServer

from hydrant.platform.db.session import Database
from hydrant.platform.digests.service import DigestService
from hydrant.platform.mail.mailer import SmtpMailer


@pytest.fixture()
async def cp(database_url: str, data_dir: Path) -> AsyncIterator[ControlPlane]:
    async with control_plane(database_url, data_dir) as plane:
        yield plane


async def test_digest_settings_route_is_admin_only_and_validates(cp: ControlPlane) -> None:
    tenant, tenant_secret = await cp.tenant_with_key("acme")
    path = f"/admin/tenants/{tenant['id']}/digest"

    assert (await cp.client.get(path)).status_code == 401
    assert (await cp.client.get(path, headers=bearer(tenant_secret))).status_code in (401, 403)
    missing = await cp.client.get("/admin/tenants/ten_nope/digest", headers=cp.admin)
    assert missing.status_code == 404

    default = await cp.client.get(path, headers=cp.admin)
    assert default.status_code == 200
    assert default.json() == {
        "object": "digest_settings",
        "tenant_id": tenant["id"],
        "enabled": True,
        "send_hour": 8,
        "timezone": tenant["timezone"],
        "recipients": [],
        "unsubscribed": [],
    }
    body = {"recipients": ["b@acme.test", "a@acme.test"], "timezone": "Asia/Kolkata"}
    changed = await cp.client.put(path, json={**body, "send_hour": 6}, headers=cp.admin)
    assert changed.status_code == 200, changed.text
    assert changed.json()["recipients"] == ["a@acme.test", "b@acme.test"]
    assert (changed.json()["send_hour"], changed.json()["timezone"]) == (6, "Asia/Kolkata")

    for bad, param in (
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"recipients": ["not an address"]}, "recipients"),
        ({"recipients": ["x@y.test\r\nBcc: all@evil.test"]}, "recipients"),
    ):
        refused = await cp.client.put(path, json=bad, headers=cp.admin)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == param
    for bad_body in ({"send_hour": 24}, {"sned_hour": 3}):
        refused = await cp.client.put(path, json=bad_body, headers=cp.admin)
        assert refused.status_code == 400, refused.text
        assert "error" in refused.json()
    after = await cp.client.get(path, headers=cp.admin)
    assert after.json()["timezone"] == "Asia/Kolkata"  # refused changes changed nothing


async def test_unsubscribe_link_stops_mail_to_that_recipient_only(
    cp: ControlPlane, db: Database, smtp: SmtpServer
) -> None:
    tenant = await cp.create_tenant("acme")
    path = f"/admin/tenants/{tenant['id']}/digest"
    recipients = ["a@acme.test", "b@acme.test"]
    put = await cp.client.put(path, json={"recipients": recipients}, headers=cp.admin)
    assert put.status_code == 200
    settings = replace(cp.settings, smtp_url=smtp.url(), public_url="https://hydrant.example/")
    digests = DigestService(
        db, settings, SmtpMailer.from_url(smtp.url()), SERVER_SECRET.encode(), clock=lambda: SEND_AT
    )
    assert (await digests.send_tenant_digest(tenant["id"], DAY)).recipients == 2
    [mail] = smtp.inbox.to("a@acme.test")
    link = urlsplit(mail["List-Unsubscribe"].strip("<>"))
    assert link.path == "/digests/unsubscribe"

    forged = link.query.replace("token=", "token=x", 1)
    refused = await cp.client.get(f"{link.path}?{forged}")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "token"
    assert (await cp.client.get(link.path)).status_code == 400

    page = await cp.client.get(f"{link.path}?{link.query}")
    assert page.status_code == 200 and "a@acme.test" in page.text
    assert page.headers["content-type"].startswith("text/html")
    one_click = await cp.client.post(f"{link.path}?{link.query}")  # RFC 8058, idempotent
    assert one_click.status_code == 200

    next_day = await digests.send_tenant_digest(tenant["id"], DAY + timedelta(days=1))
    assert next_day.recipients == 1
    assert len(smtp.inbox.to("a@acme.test")) == 1 and len(smtp.inbox.to("b@acme.test")) == 2
    view = (await cp.client.get(path, headers=cp.admin)).json()
    assert view["unsubscribed"] == ["a@acme.test"]

    # An admin saving the list again does not re-subscribe someone who said stop.
    await cp.client.put(path, json={"recipients": recipients}, headers=cp.admin)
    third = await digests.send_tenant_digest(tenant["id"], DAY + timedelta(days=2))
    assert third.recipients == 1 and len(smtp.inbox.to("a@acme.test")) == 1
