"""Digests against a real SMTP server (aiosmtpd with STARTTLS and AUTH), on SQLite and PostgreSQL.

The numbers in the mail are checked against the ledger's own rows for the
tenant's local day (summed here in Python), not against the report code.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal
from email.message import EmailMessage
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from digest_factories import (
    DAY,
    SEND_AT,
    TZ,
    World,
    ledger_rows,
    make_ledger,
    make_world,
    model_names,
    random_traffic,
)
from smtp_inbox import SmtpServer
from sqlalchemy import select

from hydrant.platform.db.models import DigestSend
from hydrant.platform.db.session import Database
from hydrant.platform.digests.figures import local_day_window
from hydrant.platform.digests.render import CHART_CID, money
from hydrant.platform.digests.service import DigestService
from hydrant.platform.mail.mailer import MailError, SmtpMailer
from hydrant.settings import Settings, load_settings

SECRET = b"digest-test-secret-0123456789abcdef"


def settings_for(smtp: SmtpServer, data_dir: Path, **extra: object) -> Settings:
    return load_settings(
        {},
        data_dir=data_dir,
        smtp_url=smtp.url(),
        public_url="https://hydrant.example",
        digest_from="Hydrant <digest@hydrant.example>",
        **extra,
    )


def service(db: Database, settings: Settings) -> DigestService:
    assert settings.smtp_url is not None
    mailer = SmtpMailer.from_url(settings.smtp_url)
    return DigestService(db, settings, mailer, SECRET, clock=lambda: SEND_AT)


def parts(message: EmailMessage) -> tuple[str, str, list[EmailMessage]]:
    text = message.get_body(preferencelist=("plain",))
    html = message.get_body(preferencelist=("html",))
    assert text is not None and html is not None
    images = [p for p in message.walk() if p.get_content_type() == "image/png"]
    plain = str(text.get_content()).replace("\r\n", "\n")  # type: ignore[attr-defined]
    return plain, str(html.get_content()), images  # type: ignore[attr-defined]


async def expected_day(db: Database, world: World) -> dict[str, dict[str, Decimal | int]]:
    """Per model and in total ("*"): requests, tokens, charged, from the ledger's rows."""
    since, until = local_day_window(DAY, ZoneInfo(TZ))
    names = await model_names(db)
    sums: dict[str, dict[str, Decimal | int]] = defaultdict(
        lambda: {"requests": 0, "tokens": 0, "charged": Decimal(0)}
    )
    for row in await ledger_rows(db, world.tenant_id, since, until):
        for bucket in (names[row.model_id], "*"):
            sums[bucket]["requests"] += 1
            sums[bucket]["tokens"] += row.input_tokens + row.output_tokens
            sums[bucket]["charged"] += row.charged
    return sums


async def test_digest_arrives_with_both_parts_the_ledger_numbers_and_the_chart(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db)
    await random_traffic(make_ledger(db, data_dir), world)
    digests = service(db, settings_for(smtp, data_dir))

    result = await digests.send_tenant_digest(world.tenant_id, DAY)

    assert (result.outcome, result.recipients) == ("sent", 2)
    assert smtp.inbox.count() == 2 and smtp.inbox.logins  # AUTH over STARTTLS happened
    expected = await expected_day(db, world)
    assert expected["*"]["requests"] > 3  # the edges and the random entries are there
    for address in ("ops@acme.test", "cfo@acme.test"):
        [message] = smtp.inbox.to(address)
        assert message.get_content_type() == "multipart/alternative"
        text, html, images = parts(message)
        total = expected["*"]
        for body in (text, html):
            assert f"{total['requests']:,}" in body
            assert f"{total['tokens']:,}" in body
            assert money(Decimal(total["charged"])) in body
        assert f"Requests: {total['requests']:,}\n" in text
        assert f"Charged: {money(Decimal(total['charged']))}\n" in text
        for model, sums in expected.items():
            if model == "*":
                continue
            line = f"- {model}: {sums['requests']:,} requests, {sums['tokens']:,} tokens,"
            assert f"{line} charged {money(Decimal(sums['charged']))}" in text
        # the chart: a PNG attached inline, referenced by Content-ID from the HTML
        [image] = images
        assert image["Content-ID"] == f"<{CHART_CID}>"
        assert f'src="cid:{CHART_CID}"' in html
        assert image.get_content().startswith(b"\x89PNG\r\n\x1a\n")  # type: ignore[attr-defined]
        # keys by their public prefix only; the unsubscribe link is the recipient's own
        assert any(prefix in text for _, prefix in world.keys.values())
        assert not any(h in message.as_string() for h in world.key_hashes)
        link = message["List-Unsubscribe"].strip("<>")
        assert link.startswith("https://hydrant.example/digests/unsubscribe?token=")
        assert link in text


async def test_a_digest_is_sent_once_per_tenant_and_day(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db, recipients=["ops@acme.test"])
    await random_traffic(make_ledger(db, data_dir), world)
    digests = service(db, settings_for(smtp, data_dir))

    first = await digests.send_tenant_digest(world.tenant_id, DAY)
    second = await digests.send_tenant_digest(world.tenant_id, DAY)  # beat fired twice

    assert (first.outcome, second.outcome) == ("sent", "already_sent")
    assert smtp.inbox.count() == 1
    assert await digests.due_digests(SEND_AT) == []  # and the scheduler sees it as done
    async with db.session() as session:
        [claim] = await session.scalars(select(DigestSend))
    assert (claim.status, claim.recipients, claim.day) == ("sent", 1, DAY)


class CrashAfterSending:
    """Hands the mail to the real server, then dies (as a worker killed right after sending)."""

    def __init__(self, inner: SmtpMailer) -> None:
        self.inner = inner

    async def send(self, message: EmailMessage) -> None:
        await self.inner.send(message)
        raise RuntimeError("worker lost after the server accepted the mail")


async def send_cut_short(db: Database, smtp: SmtpServer, data_dir: Path) -> tuple[World, Settings]:
    """A tenant with a day of traffic whose digest the server accepted as the worker died."""
    world = await make_world(db, recipients=["ops@acme.test"])
    await random_traffic(make_ledger(db, data_dir), world)
    settings = settings_for(smtp, data_dir)
    real = SmtpMailer.from_url(smtp.url())
    dying = DigestService(db, settings, CrashAfterSending(real), SECRET, clock=lambda: SEND_AT)
    with pytest.raises(RuntimeError):
        await dying.send_tenant_digest(world.tenant_id, DAY)
    return world, settings


async def test_a_worker_dying_after_sending_does_not_send_again_on_retry(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world, settings = await send_cut_short(db, smtp, data_dir)
    retry = await service(db, settings).send_tenant_digest(world.tenant_id, DAY)

    assert retry.outcome == "already_sent"
    assert smtp.inbox.count() == 1


async def test_a_refused_send_gives_the_claim_back_so_the_retry_sends(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db, recipients=["ops@acme.test"])
    await random_traffic(make_ledger(db, data_dir), world)
    settings = settings_for(smtp, data_dir)
    wrong = replace(SmtpMailer.from_url(smtp.url()), password="wrong")
    refused = DigestService(db, settings, wrong, SECRET, clock=lambda: SEND_AT)

    with pytest.raises(MailError) as failure:
        await refused.send_tenant_digest(world.tenant_id, DAY)
    assert "wrong" not in str(failure.value)  # the password never reaches an error or a log
    smtp.inbox.refuse_next = 1  # and one more failure: the server answers 451 to DATA
    with pytest.raises(MailError):
        await service(db, settings).send_tenant_digest(world.tenant_id, DAY)
    assert smtp.inbox.count() == 0

    result = await service(db, settings).send_tenant_digest(world.tenant_id, DAY)
    assert result.outcome == "sent" and smtp.inbox.count() == 1


@pytest.mark.parametrize("mode", ["send", "skip"])
async def test_a_tenant_without_usage_gets_a_short_digest_or_none_by_setting(
    db: Database, smtp: SmtpServer, data_dir: Path, mode: str
) -> None:
    world = await make_world(db, name="idle", recipients=["idle@acme.test"])
    digests = service(db, settings_for(smtp, data_dir, digest_no_usage=mode))

    result = await digests.send_tenant_digest(world.tenant_id, DAY)

    if mode == "skip":
        assert result.outcome == "skipped" and smtp.inbox.count() == 0
    else:
        [message] = smtp.inbox.to("idle@acme.test")
        text, html, images = parts(message)
        assert "No usage on 2026-11-30" in text and "No usage on 2026-11-30" in html
        assert "no usage" in message["Subject"].lower()
        assert images == []
    again = await digests.send_tenant_digest(world.tenant_id, DAY)
    assert again.outcome == "already_sent"


async def test_numbers_against_the_day_before_and_the_week(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    world = await make_world(db, recipients=["ops@acme.test"])
    ledger = make_ledger(db, data_dir)
    await random_traffic(ledger, world)
    await service(db, settings_for(smtp, data_dir)).send_tenant_digest(world.tenant_id, DAY)
    [message] = smtp.inbox.to("ops@acme.test")
    text, _, _ = parts(message)

    zone = ZoneInfo(TZ)
    charged = []
    for back in range(8):
        since, until = local_day_window(DAY - timedelta(days=back), zone)
        rows = await ledger_rows(db, world.tenant_id, since, until)
        charged.append(sum((r.charged for r in rows), Decimal(0)))
    day, previous, week = charged[0], charged[1], sum(charged[1:], Decimal(0)) / 7
    from hydrant.platform.digests.render import percent

    assert f"Change vs the day before: {percent((day - previous) * 100 / previous)}" in text
    assert f"Change vs the 7-day average: {percent((day - week) * 100 / week)}" in text
    assert f"(average {money(week)})" in text


async def test_admin_digest_has_revenue_cost_and_margin_by_tenant_and_model(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    names = {}
    for seed, tenant in enumerate(("acme", "globex")):
        world = await make_world(db, name=tenant, recipients=[f"ops@{tenant}.test"])
        await random_traffic(make_ledger(db, data_dir), world, seed=seed + 10, per_day=4 + seed)
        names[world.tenant_id] = tenant
    settings = settings_for(smtp, data_dir, admin_digest_to="boss@hydrant.test, cfo@hydrant.test")

    result = await service(db, settings).send_admin_digest(DAY)
    again = await service(db, settings).send_admin_digest(DAY)

    assert (result.outcome, result.recipients, again.outcome) == ("sent", 2, "already_sent")
    assert smtp.inbox.count() == 2
    [message] = smtp.inbox.to("boss@hydrant.test")
    text, html, images = parts(message)
    assert len(images) == 1

    models = await model_names(db)
    since, until = local_day_window(DAY, ZoneInfo("UTC"))
    before = local_day_window(DAY - timedelta(days=1), ZoneInfo("UTC"))
    sums: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for row in await ledger_rows(db, None, since, until):
        for key in (names[row.tenant_id], models[row.model_id], "*"):
            sums[key][0] += row.charged
            sums[key][1] += row.device_cost
    assert sums["*"][1] > 0  # device cost is there to subtract
    for key, (charged, cost) in sums.items():
        if key == "*":
            assert f"Revenue: {money(charged)} " in text
            assert f"Margin: {money(charged - cost)}\n" in text
            continue
        line = f"- {key}: {money(charged)} / {money(cost)} / {money(charged - cost)}\n"
        assert line in text
        assert f'<td>{key}</td><td style="text-align: right;">{money(charged)}</td>' in html
    # the biggest mover comes first
    previous: dict[str, Decimal] = defaultdict(Decimal)
    for row in await ledger_rows(db, None, *before):
        previous[names[row.tenant_id]] += row.charged
    deltas = {n: sums[n][0] - previous[n] for n in names.values()}
    top = max(deltas, key=lambda n: abs(deltas[n]))
    movers = text.split("Biggest movers (revenue vs the day before):\n", 1)[1]
    assert movers.startswith(f"- {top}: {money(previous[top])} -> {money(sums[top][0])}")


async def test_smtps_with_implicit_tls(db: Database, data_dir: Path, tmp_path: Path) -> None:
    from smtp_inbox import smtp_server

    world = await make_world(db, recipients=["ops@acme.test"])
    with smtp_server(tmp_path, implicit_tls=True) as smtps:
        assert smtps.url().startswith("smtps://")
        result = await service(db, settings_for(smtps, data_dir)).send_tenant_digest(
            world.tenant_id, DAY
        )
        assert result.outcome == "sent" and smtps.inbox.count() == 1 and smtps.inbox.logins


async def test_a_digest_shows_batch_spend_apart(
    db: Database, smtp: SmtpServer, data_dir: Path
) -> None:
    from html import escape

    from hydrant.engine.protocol import RequestUsage, Sampling
    from hydrant.platform.inference.params import PreparedRequest
    from hydrant.platform.ledger.accounting import Outcome
    from hydrant.platform.ledger.repository import insert_if_absent
    from hydrant.platform.ledger.service import raw_entry
    from hydrant.platform.quotas.admission import RequestContext

    world = await make_world(db)
    ledger = make_ledger(db, data_dir)
    await random_traffic(ledger, world)
    since, _ = local_day_window(DAY, ZoneInfo(TZ))
    key_id, prefix = world.keys["batch"]
    ctx = RequestContext(
        request_id="batch_req_abc_1",
        tenant_id=world.tenant_id,
        api_key_id=key_id,
        key_prefix=prefix,
        model=(await model_names(db)).popitem()[1],
        prepared=PreparedRequest.single([1, 2, 3], Sampling(max_tokens=4)),
        started_at=since + timedelta(hours=12),
    )
    usage = RequestUsage(prompt_tokens=2000, cached_tokens=0, completion_tokens=1000, device_ns=1)
    outcome = Outcome("finished", usage, since + timedelta(hours=12, seconds=3))
    async with db.session() as session:
        entry = await ledger.price_entry(session, raw_entry(ctx, outcome, batch_id="batch_abc"))
        await insert_if_absent(session, [entry])
    assert entry["charged"] > 0 and entry["batch_id"] == "batch_abc"
    await service(db, settings_for(smtp, data_dir)).send_tenant_digest(world.tenant_id, DAY)
    [message] = smtp.inbox.to("ops@acme.test")
    text, html, _ = parts(message)
    shown = money(entry["charged"])
    assert f"Of which batches (Batch API, at the batch price): {shown} for 1 lines\n" in text
    assert f"(batches {shown})" in text
    assert f"(batches {escape(shown)})" in html
