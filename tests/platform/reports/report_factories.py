"""Ledger rows for report tests, written straight to the table (reports only read it)."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from hydrant.platform.db.models import LedgerEntry, ModelDeployment, Tenant

BASE = datetime(2026, 3, 1, tzinfo=UTC)

# Amounts chosen to break float sums and naive rounding: one micro-unit, exact
# halves at the cent (half-even territory), repeating-decimal thirds, big values.
AWKWARD = [
    Decimal("0.000001"),
    Decimal("0.005000"),
    Decimal("0.015000"),
    Decimal("0.333333"),
    Decimal("0.666667"),
    Decimal("0.100000"),
    Decimal("0.200000"),
    Decimal("999.999999"),
    Decimal("12345.678901"),
    Decimal("0"),
]


@dataclass(frozen=True)
class Row:
    """What a test inserted, kept to compute the expected report in Python."""

    request_id: str
    tenant_id: str
    model: str
    finished_at: datetime
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    charged: Decimal
    device_seconds: Decimal
    device_cost: Decimal
    batch_id: str | None = None  # a Batch API line's


async def add_tenants(session: AsyncSession, names: Iterable[str]) -> dict[str, str]:
    tenants = {name: Tenant(name=name) for name in names}
    session.add_all(tenants.values())
    await session.flush()
    return {name: t.id for name, t in tenants.items()}


async def add_models(session: AsyncSession, names: Iterable[str]) -> dict[str, str]:
    models = {name: ModelDeployment(name=name, path=f"/models/{name}") for name in names}
    session.add_all(models.values())
    await session.flush()
    return {name: m.id for name, m in models.items()}


def awkward_amount(rng: random.Random) -> Decimal:
    if rng.random() < 0.5:
        return rng.choice(AWKWARD)
    return Decimal(rng.randrange(0, 10**9)).scaleb(-6)


def random_rows(
    tenant_ids: Sequence[str], models: Sequence[str], count: int, *, seed: int = 7
) -> list[Row]:
    """`count` entries over ~10 days, every amount awkward, device seconds with 9 places."""
    rng = random.Random(seed)
    rows = []
    for n in range(count):
        inputs = rng.randrange(0, 9000)
        rows.append(
            Row(
                request_id=f"req_{seed}_{n:05d}",
                tenant_id=rng.choice(tenant_ids),
                model=rng.choice(models),
                finished_at=BASE
                + timedelta(
                    seconds=rng.randrange(0, 10 * 86400), microseconds=rng.randrange(0, 10**6)
                ),
                input_tokens=inputs,
                cached_tokens=rng.randrange(0, inputs + 1),
                output_tokens=rng.randrange(0, 4000),
                charged=awkward_amount(rng),
                device_seconds=Decimal(rng.randrange(0, 5 * 10**10)).scaleb(-9),
                device_cost=awkward_amount(rng),
            )
        )
    return rows


async def insert_rows(
    session: AsyncSession, rows: Iterable[Row], model_ids: dict[str, str]
) -> None:
    session.add_all(
        LedgerEntry(
            request_id=r.request_id,
            tenant_id=r.tenant_id,
            model_id=model_ids[r.model],
            status="finished",
            input_tokens=r.input_tokens,
            cached_tokens=r.cached_tokens,
            output_tokens=r.output_tokens,
            charged=r.charged,
            device_seconds=r.device_seconds,
            device_cost=r.device_cost,
            started_at=r.finished_at - timedelta(seconds=1),
            finished_at=r.finished_at,
            batch_id=r.batch_id,
        )
        for r in rows
    )
    await session.flush()


def row(
    tenant_id: str,
    model: str,
    finished_at: datetime,
    charged: str,
    *,
    request_id: str,
    device_cost: str = "0",
    tokens: tuple[int, int, int] = (10, 0, 5),
    batch_id: str | None = None,
) -> Row:
    return Row(
        request_id=request_id,
        tenant_id=tenant_id,
        model=model,
        finished_at=finished_at,
        input_tokens=tokens[0],
        cached_tokens=tokens[1],
        output_tokens=tokens[2],
        charged=Decimal(charged),
        device_seconds=Decimal("0.5"),
        device_cost=Decimal(device_cost),
        batch_id=batch_id,
    )
