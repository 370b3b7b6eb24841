"""Delivering the outbox: claim a batch, send it, mark each record `sent` after a 2xx.

The claim is the alerts' (`digests/alert_mail.py`): a conditional UPDATE per row that
only one exporter can win (`pending` -> `sending`), and a failure puts the row back to
`pending`. The export differs in one respect, on purpose: an alert left at `sending` by
a dead worker is never re-mailed (a duplicate mail is worse than a lost one), while a
usage record must never be skipped, so `sending` is a lease: once `claimed_at` is older
than `usage_export_lease_s`, any exporter may claim the row again and re-send it. The
receiver counts it once by its idempotency key. Marking needs the exporter's own claim
token, so an exporter whose lease lapsed cannot mark what another now holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from hydrant.platform.db.base import new_id
from hydrant.platform.db.models import BillingCustomer, UsageExportRecord
from hydrant.platform.db.session import Database
from hydrant.platform.usage_export import wire
from hydrant.settings import Settings

log = logging.getLogger(__name__)

MAX_BACKOFF = timedelta(hours=1)
R = UsageExportRecord


@dataclass(frozen=True)
class ExportTarget:
    """Where and how records go; None from settings when no receiver is configured."""

    url: str
    format: str
    secret: str | None
    event_name: str
    batch_size: int
    backoff: timedelta
    lease: timedelta
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> ExportTarget | None:
        if not settings.usage_export_url:
            return None
        return cls(
            url=settings.usage_export_url,
            format=settings.usage_export_format,
            secret=settings.usage_export_secret,
            event_name=settings.usage_export_event_name,
            batch_size=max(1, settings.usage_export_batch_size),
            backoff=timedelta(seconds=settings.usage_export_backoff_s),
            lease=timedelta(seconds=settings.usage_export_lease_s),
            timeout_s=settings.usage_export_timeout_s,
        )

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.secret}"} if self.secret else {}

    def retry_at(self, now: datetime, attempts: int) -> datetime:
        """Exponential backoff: the first retry after `backoff`, doubling, at most an hour."""
        return now + min(self.backoff * (2 ** max(attempts - 1, 0)), MAX_BACKOFF)


@dataclass
class DeliveryReport:
    due: int = 0
    sent: int = 0
    failed: int = 0
    waiting: int = 0  # Stripe records of tenants with no Stripe customer set


class DeliveryFailed(Exception):
    """The receiver answered other than 2xx, or not in time: the batch goes back to pending."""


def _due(now: datetime, lease: timedelta) -> ColumnElement[bool]:
    return or_(
        and_(R.status == "pending", R.next_attempt_at <= now),
        and_(R.status == "sending", R.claimed_at < now - lease),
    )


def _candidates(target: ExportTarget, now: datetime) -> Any:
    statement = select(R, BillingCustomer.stripe_customer_id)
    if target.format == "stripe":  # a tenant with no customer waits until one is set
        statement = statement.join(BillingCustomer, BillingCustomer.tenant_id == R.tenant_id)
    else:
        statement = statement.outerjoin(BillingCustomer, BillingCustomer.tenant_id == R.tenant_id)
    return statement.where(_due(now, target.lease))


async def _count(database: Database, target: ExportTarget, now: datetime) -> DeliveryReport:
    async with database.session() as session:
        due = await session.scalar(
            select(func.count()).select_from(_candidates(target, now).subquery())
        )
        waiting = 0
        if target.format == "stripe":
            waiting = (
                await session.scalar(
                    select(func.count())
                    .select_from(R)
                    .where(
                        R.status != "sent",
                        ~select(BillingCustomer.tenant_id)
                        .where(BillingCustomer.tenant_id == R.tenant_id)
                        .exists(),
                    )
                )
                or 0
            )
    return DeliveryReport(due=due or 0, waiting=waiting)


async def claim(
    database: Database, target: ExportTarget, now: datetime, token: str
) -> list[tuple[UsageExportRecord, str | None]]:
    """Take up to a batch of due records for `token`; each row is won by one exporter.

    A batch lost whole to another exporter is not the end: what it took is no longer
    due, so the next look finds the rest (empty only when nothing is due)."""
    while True:
        async with database.session() as session:
            rows = (
                await session.execute(
                    _candidates(target, now)
                    .order_by(R.hour, R.sequence, R.id)
                    .limit(target.batch_size)
                )
            ).all()
            taken = []
            for record, customer in rows:
                won = await session.execute(
                    update(R)
                    .where(R.id == record.id, _due(now, target.lease))
                    .values(status="sending", claim=token, claimed_at=now)
                    .execution_options(synchronize_session=False)
                )
                if won.rowcount == 1:  # type: ignore[attr-defined]
                    taken.append((record, customer))
        if taken or not rows:
            return taken


async def _mark_sent(
    database: Database, records: list[UsageExportRecord], token: str, now: datetime
) -> None:
    async with database.session() as session:
        await session.execute(
            update(R)
            .where(R.id.in_([r.id for r in records]), R.claim == token, R.status == "sending")
            .values(status="sent", sent_at=now, last_error=None)
        )


async def _release(
    database: Database,
    target: ExportTarget,
    records: list[UsageExportRecord],
    token: str,
    now: datetime,
    error: str,
) -> None:
    async with database.session() as session:
        for record in records:
            attempts = record.attempts + 1
            await session.execute(
                update(R)
                .where(R.id == record.id, R.claim == token, R.status == "sending")
                .values(
                    status="pending",
                    claim=None,
                    attempts=attempts,
                    next_attempt_at=target.retry_at(now, attempts),
                    last_error=error[:200],
                )
            )


async def _post(
    client: httpx.AsyncClient, target: ExportTarget, key: str | None = None, **body: Any
) -> None:
    headers = target.headers()
    if key is not None:
        headers["Idempotency-Key"] = key
    try:
        response = await client.post(target.url, headers=headers, **body)
    except httpx.HTTPError as exc:
        raise DeliveryFailed(type(exc).__name__) from exc
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(f"HTTP {response.status_code}")


async def _send_batch(
    database: Database,
    target: ExportTarget,
    client: httpx.AsyncClient,
    batch: list[tuple[UsageExportRecord, str | None]],
    token: str,
    clock: Callable[[], datetime],
    report: DeliveryReport,
) -> None:
    """Send a claimed batch, counting into `report` what is marked sent; raises
    `DeliveryFailed` on the first failure (what was marked before it stays sent)."""
    if target.format == "json":
        records = [record for record, _ in batch]
        body = [wire.json_record(record, customer) for record, customer in batch]
        await _post(client, target, json={"records": body})
        await _mark_sent(database, records, token, clock())
        report.sent += len(records)
        return
    for record, customer in batch:
        assert customer is not None  # the stripe claim joins on a customer
        form = wire.stripe_form(record, target.event_name, customer)
        await _post(client, target, record.idempotency_key, data=form)
        await _mark_sent(database, [record], token, clock())
        report.sent += 1


async def deliver(
    database: Database,
    target: ExportTarget,
    client: httpx.AsyncClient,
    clock: Callable[[], datetime],
) -> DeliveryReport:
    """Send every due record, a batch at a time, logging progress; stops at the first
    failure (the receiver is down or refusing: the next run retries after the backoff)."""
    token = new_id("clm")
    report = await _count(database, target, clock())
    if report.waiting:
        log.warning(
            "usage export: records wait for their tenants' Stripe customer"
            " (hydrant billing customer TENANT CUS_ID)",
            extra={"records": report.waiting},
        )
    if report.due:
        log.info("usage export: delivering", extra={"due": report.due, "format": target.format})
    while batch := await claim(database, target, clock(), token):
        try:
            await _send_batch(database, target, client, batch, token, clock, report)
        except DeliveryFailed as exc:
            unsent = [r for r, _ in batch]
            await _release(database, target, unsent, token, clock(), str(exc))
            report.failed += 1
            log.warning(
                "usage export: the receiver failed; retrying after the backoff",
                extra={"error": str(exc), "sent": report.sent, "due": report.due},
            )
            break
        log.info("usage export: progress", extra={"sent": report.sent, "due": report.due})
    return report
