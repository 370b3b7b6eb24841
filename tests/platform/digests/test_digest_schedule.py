"""Which digests are due: each tenant's own hour in its own time zone, caught up when late."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

from digest_factories import make_world

from hydrant.platform.db.models import DigestSettings
from hydrant.platform.db.session import Database
from hydrant.platform.digests.service import DigestService
from hydrant.platform.mail.mailer import OutboxMailer
from hydrant.settings import load_settings


async def test_due_digests_by_local_hour_zone_and_creation(db: Database, data_dir: Path) -> None:
    tokyo = await make_world(db, name="tokyo", timezone="Asia/Tokyo")  # default hour 08
    ny = await make_world(db, name="ny", timezone="America/New_York")
    late = await make_world(db, name="late", timezone="UTC")
    off = await make_world(db, name="off", timezone="UTC")
    new = await make_world(
        db, name="new", timezone="UTC", created_at=datetime(2026, 12, 2, 1, tzinfo=UTC)
    )
    async with db.session() as session:
        session.add(DigestSettings(tenant_id=late.tenant_id, send_hour=23, timezone="UTC"))
        session.add(DigestSettings(tenant_id=off.tenant_id, enabled=False, timezone="UTC"))
    settings = load_settings({}, data_dir=data_dir, admin_digest_to="boss@x.test")
    digests = DigestService(db, settings, OutboxMailer(data_dir / "out"), b"s" * 32)

    # 2026-12-02 10:00 UTC: 19:00 in Tokyo (its Dec 1 is due), 05:00 in New York (not yet)
    due = await digests.due_digests(datetime(2026, 12, 2, 10, tzinfo=UTC))
    assert due == [(tokyo.tenant_id, date(2026, 12, 1))]
    # 14:00 UTC: 09:00 in New York; "new" was created on Dec 2, so it has no Dec 1
    # digest; "late" waits for 23:00; "off" never comes
    due = await digests.due_digests(datetime(2026, 12, 2, 14, tzinfo=UTC))
    assert sorted(due) == sorted(
        [(tokyo.tenant_id, date(2026, 12, 1)), (ny.tenant_id, date(2026, 12, 1))]
    )
    assert new.tenant_id not in dict(due)
    due = await digests.due_digests(datetime(2026, 12, 2, 23, 30, tzinfo=UTC))
    assert (late.tenant_id, date(2026, 12, 1)) in due and off.tenant_id not in dict(due)
    # once sent, a digest is no longer due (a catch-up never sends it twice)
    await digests.send_tenant_digest(tokyo.tenant_id, date(2026, 12, 1))
    due = await digests.due_digests(datetime(2026, 12, 2, 14, tzinfo=UTC))
    assert tokyo.tenant_id not in dict(due)

    assert await digests.admin_digest_due(datetime(2026, 12, 2, 6, tzinfo=UTC)) is None
    assert await digests.admin_digest_due(datetime(2026, 12, 2, 7, tzinfo=UTC)) == date(2026, 12, 1)
