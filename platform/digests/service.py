"""Sending digests once, and the per-tenant digest settings.

Once means: the send is claimed in the database (a unique row per kind,
subject and day) and committed BEFORE any mail leaves; a second run (beat
firing twice, a task delivered twice, a retry after the worker died) finds the
claim and sends nothing. The claim is given back only when the mail server
certainly accepted nothing, so a retry then sends it; if the worker dies
mid-send the claim stays (`sending`) and the digest is not sent again: a
missing digest can be re-sent by a person, a duplicate cannot be unsent.
A claim still `sending` after `STUCK_AFTER` is such a case: the dispatcher
logs it, an admin lists it (`GET /admin/digests/stuck`, `hydrant jobs
stuck-digests`), checks the mail server's log for its Message-ID, and re-sends
it (`POST /admin/digests/stuck/{id}/resend`), which releases the claim and
sends that digest again at once, whatever its day.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from email.message import EmailMessage
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.auth.principal import CONSOLE, Principal
from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import DigestSend, DigestSettings, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.digests.budgets import budget_uses
from hydrant.platform.digests.chart import daily_chart_png
from hydrant.platform.digests.figures import (
    AdminDigest,
    TenantDigest,
    build_admin_digest,
    build_tenant_digest,
    day_report,
    local_day_window,
    tenant_days,
)
from hydrant.platform.digests.render import build_message, render
from hydrant.platform.digests.schemas import DigestSettingsUpdate, DigestSettingsView
from hydrant.platform.digests.unsubscribe import Unsubscription, make_token, read_token
from hydrant.platform.errors import Conflict, InvalidRequest, NotFound
from hydrant.platform.mail.mailer import Mailer, MailError
from hydrant.platform.reports.service import ReportService
from hydrant.platform.tenants.repository import get_tenant, plan_of
from hydrant.settings import Settings

log = logging.getLogger(__name__)

ADMIN_SCOPE = "admin"  # the unsubscribe scope of the admin digest
PLATFORM = "platform"  # the subject of the admin digest's send claims
DEFAULT_SEND_HOUR = 8
UTC_ZONE = ZoneInfo("UTC")
# A send holds its claim for seconds (one SMTP session); one still `sending` after this
# long belongs to a worker that stopped mid-send.
STUCK_AFTER = timedelta(minutes=15)

Outcome = Literal["sent", "skipped", "already_sent", "no_recipients"]


@dataclass(frozen=True)
class SendResult:
    outcome: Outcome
    recipients: int = 0


def zone_of(name: str) -> ZoneInfo:
    """A time zone by IANA name; UTC (logged) for a name this system does not know."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown time zone %r: using UTC", name)
        return UTC_ZONE


def public_url(settings: Settings) -> str:
    return (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")


def valid_email(address: str) -> str:
    """A plain address (no display name, no header-breaking characters); 400 otherwise."""
    value = address.strip()
    local, at, domain = value.rpartition("@")
    if (
        not at
        or not local
        or "." not in domain
        or any(c.isspace() or c in "<>,;\"'\\" for c in value)
        or len(value) > 320
    ):
        raise InvalidRequest(f"{address!r} is not an email address", param="recipients")
    return value


@dataclass(frozen=True)
class DigestSchedule:
    """A tenant's effective digest settings (defaults when it has no row)."""

    enabled: bool
    send_hour: int
    timezone: str

    @classmethod
    def of(cls, tenant: Tenant, row: DigestSettings | None) -> DigestSchedule:
        if row is None:
            return cls(enabled=True, send_hour=DEFAULT_SEND_HOUR, timezone=tenant.timezone)
        return cls(enabled=row.enabled, send_hour=row.send_hour, timezone=row.timezone)


class DigestService:
    """Builds, claims and sends digests; a job and a test drive it the same way."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        mailer: Mailer,
        secret: bytes,
        *,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.database = database
        self.settings = settings
        self.mailer = mailer
        self.secret = secret
        self.clock = clock

    def unsubscribe_url(self, scope: str, email: str) -> str:
        token = make_token(self.secret, scope, email)
        return f"{public_url(self.settings)}/digests/unsubscribe?token={token}"

    async def unsubscribe(self, token: str) -> Unsubscription:
        who = read_token(self.secret, token)
        async with self.database.session() as session:
            await repository.add_unsubscribe(session, who.scope, who.email)
        log.info("digest recipient unsubscribed", extra={"scope": who.scope})
        return who

    async def recipients_for(self, session: AsyncSession, tenant: Tenant) -> list[str]:
        listed = await repository.recipients_of(session, tenant.id)
        if not listed and tenant.contact_email:
            listed = [tenant.contact_email]
        gone = await repository.unsubscribed(session, tenant.id)
        return [r for r in listed if r not in gone]

    async def send_tenant_digest(self, tenant_id: str, day: date) -> SendResult:
        """Yesterday's (`day`'s) digest for one tenant, sent at most once."""
        async with self.database.session() as session:
            tenant = await session.get(Tenant, tenant_id)
            if tenant is None:
                raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
            schedule = DigestSchedule.of(tenant, await repository.settings_of(session, tenant_id))
            recipients = await self.recipients_for(session, tenant)
            digest = None
            if recipients:
                reports = ReportService(session)
                zone = zone_of(schedule.timezone)
                since, until = local_day_window(day, zone)
                digest = build_tenant_digest(
                    tenant_id=tenant.id,
                    tenant_name=tenant.name,
                    timezone=schedule.timezone,
                    days=await tenant_days(reports, tenant.id, day, zone),
                    top_keys=await repository.top_keys(session, CONSOLE, tenant.id, since, until),
                    budgets=await budget_uses(
                        reports, tenant.id, await plan_of(session, tenant), self.clock()
                    ),
                )
        if digest is None or (not digest.has_usage and self.settings.digest_no_usage == "skip"):
            outcome: Outcome = "no_recipients" if digest is None else "skipped"
            return await self._record_skip("tenant", tenant_id, day, outcome)
        # Rendered before the claim: a rendering failure must not leave a claim behind
        # (a claimed digest is never sent again), only a job to retry.
        messages = await asyncio.to_thread(self._tenant_messages, tenant.name, digest, recipients)
        return await self._claim_and_deliver("tenant", tenant_id, day, messages)

    def _tenant_messages(
        self, tenant_name: str, digest: TenantDigest, recipients: list[str]
    ) -> list[EmailMessage]:
        day = digest.day.isoformat()
        chart = None
        subject = f"Hydrant: no usage for {tenant_name} on {day}"
        if digest.has_usage:
            chart = daily_chart_png(digest.series, f"Charged per day ({digest.timezone})")
            subject = f"Hydrant usage for {tenant_name} on {day}"
        return [
            build_message(
                render(
                    "tenant_digest",
                    subject,
                    chart,
                    digest=digest,
                    unsubscribe_url=self.unsubscribe_url(digest.tenant_id, r),
                ),
                sender=self.settings.digest_from,
                recipient=r,
                message_key=f"tenant|{digest.tenant_id}|{day}",
                unsubscribe_url=self.unsubscribe_url(digest.tenant_id, r),
            )
            for r in recipients
        ]

    async def send_admin_digest(self, day: date) -> SendResult:
        """The platform's digest for the UTC day `day`, to `HYDRANT_ADMIN_DIGEST_TO`."""
        configured = [
            valid_email(a) for a in (self.settings.admin_digest_to or "").split(",") if a.strip()
        ]
        async with self.database.session() as session:
            gone = await repository.unsubscribed(session, ADMIN_SCOPE)
            recipients = [r for r in configured if r not in gone]
            reports = ReportService(session)
            days = [
                await day_report(reports, day - timedelta(days=back), UTC_ZONE, None)
                for back in range(7, -1, -1)
            ]
            names = {t.id: t.name for t in await repository.all_tenants(session)}
        if not recipients:
            return await self._record_skip("admin", PLATFORM, day, "no_recipients")
        digest = build_admin_digest(days, names)
        messages = await asyncio.to_thread(self._admin_messages, digest, recipients)
        return await self._claim_and_deliver("admin", PLATFORM, day, messages)

    def _admin_messages(self, digest: AdminDigest, recipients: list[str]) -> list[EmailMessage]:
        day = digest.day.isoformat()
        chart = daily_chart_png(digest.series, "Revenue per day (UTC)")
        return [
            build_message(
                render(
                    "admin_digest",
                    f"Hydrant platform digest for {day}",
                    chart,
                    digest=digest,
                    unsubscribe_url=self.unsubscribe_url(ADMIN_SCOPE, r),
                ),
                sender=self.settings.digest_from,
                recipient=r,
                message_key=f"admin|{day}",
                unsubscribe_url=self.unsubscribe_url(ADMIN_SCOPE, r),
            )
            for r in recipients
        ]

    async def _record_skip(
        self, kind: str, subject_id: str, day: date, outcome: Outcome
    ) -> SendResult:
        """Record a digest that is not mailed, so the dispatcher stops offering it."""
        async with self.database.session() as session:
            claim = await repository.claim_send(session, kind, subject_id, day)
            if claim is None:
                return SendResult("already_sent")
            await repository.finish_send(
                session, claim, status="skipped", recipients=0, message_id=None
            )
        return SendResult(outcome)

    async def _claim_and_deliver(
        self, kind: str, subject_id: str, day: date, messages: Sequence[EmailMessage]
    ) -> SendResult:
        async with self.database.session() as session:  # committed before any mail leaves
            claim = await repository.claim_send(session, kind, subject_id, day)
        if claim is None:
            return SendResult("already_sent")
        result = await self._deliver(claim, messages)
        log.info(
            "digest sent",
            extra={
                "kind": kind,
                "subject": subject_id,
                "day": day.isoformat(),
                "recipients": result.recipients,
            },
        )
        return result

    async def _deliver(self, claim: str, messages: Sequence[EmailMessage]) -> SendResult:
        """Send the claimed digest; give the claim back only if nothing was accepted."""
        delivered = 0
        try:
            for message in messages:
                await self.mailer.send(message)
                delivered += 1
        except MailError:
            if delivered == 0:
                async with self.database.session() as session:
                    await repository.release_claim(session, claim)
                raise
            log.error("digest reached only some recipients", extra={"delivered": delivered})
        async with self.database.session() as session:
            await repository.finish_send(
                session,
                claim,
                status="sent",
                recipients=delivered,
                message_id=str(messages[0]["Message-ID"]) if messages else None,
            )
        return SendResult("sent", delivered)

    async def stuck_sends(self, now: datetime | None = None) -> list[DigestSend]:
        """Claims left `sending` for longer than `STUCK_AFTER`, oldest first."""
        moment = now or self.clock()
        async with self.database.session() as session:
            return list(await repository.stuck_sends(session, moment - STUCK_AFTER))

    async def resend_stuck(self, send_id: str, now: datetime | None = None) -> SendResult:
        """Release a stuck claim and send that digest again now (a person decided to).

        Refused for a claim that is not `sending` (it finished: sent or skipped) or
        not yet stuck (its send may still be running), so nothing here can mail a
        digest twice that the system itself would not; two admins resending at
        once release it once (the second finds the claim gone).
        """
        moment = now or self.clock()
        async with self.database.session() as session:
            claim = await repository.get_send(session, send_id)
            if claim is None:
                raise NotFound(f"no digest send {send_id!r}", param="send_id")
            if claim.status != "sending":
                raise Conflict(
                    f"digest send {send_id} is {claim.status}, not stuck: nothing to resend",
                    code="digest_not_stuck",
                )
            claimed_at = claim.claimed_at  # aware UTC on both databases (UTCDateTime)
            if moment - claimed_at < STUCK_AFTER:
                minutes = int(STUCK_AFTER.total_seconds() // 60)
                raise Conflict(
                    f"digest send {send_id} was claimed at {claimed_at.isoformat()} and may still"
                    f" be sending; a send is stuck only after {minutes} minutes",
                    code="digest_send_in_progress",
                )
            kind, subject_id, day = claim.kind, claim.subject_id, claim.day
            if not await repository.release_stuck(session, send_id):
                raise Conflict(f"digest send {send_id} changed meanwhile", code="digest_not_stuck")
        log.warning(
            "stuck digest released for resend",
            extra={"send_id": send_id, "kind": kind, "subject": subject_id, "day": str(day)},
        )
        if kind == "tenant":
            return await self.send_tenant_digest(subject_id, day)
        return await self.send_admin_digest(day)

    async def due_digests(self, now: datetime | None = None) -> list[tuple[str, date]]:
        """(tenant, day) pairs whose send hour has come today and which were not sent yet.

        "Has come" rather than "is now": a gateway or beat that was down at the hour
        catches up at its next tick, and the claim makes running this often harmless.
        """
        moment = (now or self.clock()).astimezone(UTC)
        due: list[tuple[str, date]] = []
        async with self.database.session() as session:
            tenants = await repository.active_tenants(session)
            rows = await repository.all_settings(session)
            for tenant in tenants:
                schedule = DigestSchedule.of(tenant, rows.get(tenant.id))
                local = moment.astimezone(zone_of(schedule.timezone))
                if not schedule.enabled or local.hour < schedule.send_hour:
                    continue
                day = local.date() - timedelta(days=1)
                _, day_end = local_day_window(day, zone_of(schedule.timezone))
                if tenant.created_at >= day_end:
                    continue  # the tenant did not exist yet on that day
                due.append((tenant.id, day))
            done = await repository.sent_days(
                session, "tenant", [t for t, _ in due], sorted({d for _, d in due})
            )
        return [pair for pair in due if pair not in done]

    async def admin_digest_due(self, now: datetime | None = None) -> date | None:
        moment = (now or self.clock()).astimezone(UTC)
        if not self.settings.admin_digest_to or moment.hour < self.settings.admin_digest_hour:
            return None
        day = moment.date() - timedelta(days=1)
        async with self.database.session() as session:
            record = await repository.send_record(session, "admin", PLATFORM, day)
        return None if record is not None else day


class DigestSettingsService:
    """The admin API's side: read and change one tenant's digest settings."""

    def __init__(self, session: AsyncSession) -> None:
        self._session = session

    async def _tenant(self, principal: Principal, tenant_id: str) -> Tenant:
        tenant = await get_tenant(self._session, principal, tenant_id)
        if tenant is None:
            raise NotFound(f"no tenant {tenant_id!r}", param="tenant_id")
        return tenant

    async def view(self, principal: Principal, tenant_id: str) -> DigestSettingsView:
        tenant = await self._tenant(principal, tenant_id)
        row = await repository.settings_of(self._session, tenant.id)
        schedule = DigestSchedule.of(tenant, row)
        return DigestSettingsView(
            tenant_id=tenant.id,
            enabled=schedule.enabled,
            send_hour=schedule.send_hour,
            timezone=schedule.timezone,
            recipients=await repository.recipients_of(self._session, tenant.id),
            unsubscribed=sorted(await repository.unsubscribed(self._session, tenant.id)),
        )

    async def update(
        self, principal: Principal, tenant_id: str, data: DigestSettingsUpdate
    ) -> DigestSettingsView:
        tenant = await self._tenant(principal, tenant_id)
        row = await repository.settings_of(self._session, tenant.id)
        if row is None:
            row = DigestSettings(
                tenant_id=tenant.id,
                enabled=True,
                send_hour=DEFAULT_SEND_HOUR,
                timezone=tenant.timezone,
            )
            self._session.add(row)
        if isinstance(data.enabled, bool):
            row.enabled = data.enabled
        if isinstance(data.send_hour, int):
            row.send_hour = data.send_hour
        if isinstance(data.timezone, str):
            try:
                ZoneInfo(data.timezone)
            except (ZoneInfoNotFoundError, ValueError):
                raise InvalidRequest(
                    f"{data.timezone!r} is not an IANA time zone (e.g. Europe/Berlin)",
                    param="timezone",
                ) from None
            row.timezone = data.timezone
        if isinstance(data.recipients, list):
            emails = list(dict.fromkeys(valid_email(e) for e in data.recipients))
            await repository.replace_recipients(self._session, tenant.id, emails)
        await self._session.flush()
        return await self.view(principal, tenant_id)
