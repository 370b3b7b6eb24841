"""Test data for digests: a tenant with keys, priced models and ledger entries written
through the real ledger service (`DatabaseLedger.record`), and the ledger's own rows as truth."""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

from sqlalchemy import select

from hydrant.engine.protocol import RequestUsage, Sampling
from hydrant.platform.billing.device import DevicePrice
from hydrant.platform.db.models import ApiKey, LedgerEntry, ModelDeployment, Price, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.digests import repository
from hydrant.platform.inference.params import PreparedRequest
from hydrant.platform.ledger.accounting import Outcome
from hydrant.platform.ledger.attribution import Attribution
from hydrant.platform.ledger.service import DatabaseLedger
from hydrant.platform.ledger.spool import LedgerSpool
from hydrant.platform.quotas.admission import RequestContext

TZ = "America/New_York"
DAY = date(2026, 11, 30)  # the digest's day, in the tenant's zone
SEND_AT = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)  # 09:00 in New York: after the default 08:00
MODELS = ("llama-small", "qwen-tiny")
PRICES = {
    "llama-small": (Decimal("15"), Decimal("5"), Decimal("60")),
    "qwen-tiny": (Decimal("3.333333"), Decimal("1"), Decimal("12.5")),
}


@dataclass
class World:
    tenant_id: str
    tenant_name: str
    keys: dict[str, tuple[str, str]]  # name -> (key id, prefix)
    key_hashes: list[str]


async def ensure_models(database: Database) -> None:
    async with database.session() as session:
        existing = set(await session.scalars(select(ModelDeployment.name)))
        for name in MODELS:
            if name in existing:
                continue
            model = ModelDeployment(name=name, path=f"/models/{name}")
            session.add(model)
            await session.flush()
            inp, cached, out = PRICES[name]
            session.add(
                Price(
                    model_id=model.id,
                    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                    input_per_mtok=inp,
                    cached_input_per_mtok=cached,
                    output_per_mtok=out,
                )
            )


async def make_world(
    database: Database,
    *,
    name: str = "acme",
    timezone: str = TZ,
    recipients: Sequence[str] = ("ops@acme.test", "cfo@acme.test"),
    created_at: datetime = datetime(2026, 10, 1, tzinfo=UTC),
) -> World:
    await ensure_models(database)
    async with database.session() as session:
        tenant = Tenant(name=name, timezone=timezone, created_at=created_at)
        session.add(tenant)
        await session.flush()
        keys: dict[str, tuple[str, str]] = {}
        hashes = []
        for key_name in ("backend", "batch", "notebook"):
            key = ApiKey(
                tenant_id=tenant.id,
                name=key_name,
                prefix=f"hyd_test_{secrets.token_hex(4)}",
                key_hash=secrets.token_hex(32),
            )
            session.add(key)
            await session.flush()
            keys[key_name] = (key.id, key.prefix)
            hashes.append(key.key_hash)
        await repository.replace_recipients(session, tenant.id, list(recipients))
    return World(tenant.id, name, keys, hashes)


def make_ledger(database: Database, folder: Path) -> DatabaseLedger:
    spool = LedgerSpool(folder / f"ledger-{secrets.token_hex(3)}.spool")
    return DatabaseLedger(database, spool, DevicePrice(Decimal("2.50")))


async def record(
    ledger: DatabaseLedger,
    world: World,
    *,
    key: str,
    model: str,
    finished_at: datetime,
    tokens: tuple[int, int, int],
    device_ns: int = 12_345_678_901,
    project_id: str | None = None,
) -> None:
    """An entry as the gateway records one: `key`'s id and, when given, its project."""
    key_id, prefix = world.keys[key]
    ctx = RequestContext(
        request_id=f"req_{secrets.token_hex(8)}",
        tenant_id=world.tenant_id,
        api_key_id=key_id,
        key_prefix=prefix,
        model=model,
        prepared=PreparedRequest.single([1, 2, 3], Sampling(max_tokens=4)),
        started_at=finished_at - timedelta(seconds=2),
        attribution=None if project_id is None else Attribution(project_id=project_id),
    )
    usage = RequestUsage(
        prompt_tokens=tokens[0],
        cached_tokens=tokens[1],
        completion_tokens=tokens[2],
        device_ns=device_ns,
    )
    await ledger.record(ctx, Outcome(status="finished", usage=usage, finished_at=finished_at))


def local(day: date, hour: int, minute: int = 0, zone: str = TZ) -> datetime:
    return datetime.combine(day, time(hour, minute), tzinfo=ZoneInfo(zone)).astimezone(UTC)


async def random_traffic(
    ledger: DatabaseLedger, world: World, *, day: date = DAY, seed: int = 3, per_day: int = 6
) -> None:
    """Entries on `day`, the day before, the week before, and just outside `day`'s edges."""
    rng = random.Random(seed)
    for back in range(8):
        for _ in range(per_day if back in (0, 1) else 2):
            inputs = rng.randrange(1, 9000)
            await record(
                ledger,
                world,
                key=rng.choice(list(world.keys)),
                model=rng.choice(MODELS),
                finished_at=local(
                    day - timedelta(days=back), rng.randrange(0, 24), rng.randrange(60)
                ),
                tokens=(inputs, rng.randrange(0, inputs), rng.randrange(1, 3000)),
            )
    # One second inside the local day at each edge, and one just outside it.
    for moment in (local(day, 0, 0), local(day, 23, 59), local(day + timedelta(days=1), 0, 0)):
        await record(
            ledger, world, key="batch", model=MODELS[0], finished_at=moment, tokens=(1000, 0, 1000)
        )


async def ledger_rows(
    database: Database, tenant_id: str | None, since: datetime, until: datetime
) -> list[LedgerEntry]:
    """The ledger's own rows for a period: the truth a digest is checked against."""
    async with database.session() as session:
        statement = select(LedgerEntry).where(
            LedgerEntry.finished_at >= since, LedgerEntry.finished_at < until
        )
        if tenant_id is not None:
            statement = statement.where(LedgerEntry.tenant_id == tenant_id)
        return list(await session.scalars(statement))


async def model_names(database: Database) -> dict[str, str]:
    async with database.session() as session:
        return {m.id: m.name for m in await session.scalars(select(ModelDeployment))}
