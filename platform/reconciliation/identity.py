"""The reconciliation identity of one pool and one day, and the one rule for each figure.

    device-hours held × price per hour
        = request cost + idle cost + load cost + drain cost + asleep cost      (to the cent)

Every figure is in cents, rounded once with `round_money(…, 2)` (half-even, the ledger's
one rounding function) from exact Decimals: held cost from the held seconds, each
non-ready state's cost from its own seconds, request cost from the exact sum of the
ledger's per-request device cost. Idle cost is what is left of the held cost: ready
time the requests did not use. So the identity holds to the cent by construction, and
what can fail is upstream of it (a timeline that misses held time, requests billed
more device time than the pool held: idle cost goes negative and the report shows it).

Idle cost is spread to the tenants of the pool by their share of its busy time (the
device-seconds their requests ran, from the ledger), with the largest-remainder split
(`split_exact`) in cents, so the shares add up to the idle cost exactly. A day with
idle cost but no busy time has nobody to spread it to: it stays unspread, the pool's.
The tenants' direct device cost is the pool's request cost split the same way by
their exact ledger device cost, so the lines add up to the pool's figure too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from hydrant.platform.billing.allocation import split_exact
from hydrant.platform.billing.device import SECONDS_PER_HOUR, DevicePrice
from hydrant.platform.billing.money import MONEY_CONTEXT, REPORT_PLACES, round_money

# What each registry state costs as: a worker holds its device in every one of them.
STATE_KIND = {
    "starting": "load",
    "ready": "ready",
    "draining": "drain",
    "sleeping": "asleep",
    "unloaded": "asleep",
}
KINDS = ("load", "ready", "drain", "asleep")
_MICROSECOND = timedelta(microseconds=1)
_UTILIZATION_PLACES = Decimal("0.0001")


@dataclass(frozen=True)
class Interval:
    """A worker held its device in `state` over [started_at, ended_at)."""

    worker_id: str
    state: str
    started_at: datetime
    ended_at: datetime


@dataclass(frozen=True)
class TenantUsage:
    """A tenant's ledger sums on the pool that day (exact, 6 places; seconds 9)."""

    tenant_id: str
    revenue: Decimal
    device_cost: Decimal
    busy_seconds: Decimal


@dataclass(frozen=True)
class TenantLine:
    tenant_id: str
    busy_seconds: Decimal
    revenue: Decimal
    device_cost: Decimal
    idle_cost: Decimal

    @property
    def margin(self) -> Decimal:
        """Revenue less the device time it used and its share of the time nobody used."""
        return self.revenue - self.device_cost - self.idle_cost


@dataclass(frozen=True)
class PoolDay:
    model: str
    price_per_hour: Decimal
    seconds: dict[str, Decimal]  # per kind: load, ready, drain, asleep
    busy_seconds: Decimal
    held_cost: Decimal
    request_cost: Decimal
    idle_cost: Decimal
    load_cost: Decimal
    drain_cost: Decimal
    asleep_cost: Decimal
    lines: tuple[TenantLine, ...]

    @property
    def held_seconds(self) -> Decimal:
        return sum(self.seconds.values(), Decimal(0))

    @property
    def utilization(self) -> Decimal | None:
        """Busy over held device time; None for a pool that held no device that day."""
        held = self.held_seconds
        if held == 0:
            return None
        return MONEY_CONTEXT.divide(self.busy_seconds, held).quantize(_UTILIZATION_PLACES)

    @property
    def unspread_idle_cost(self) -> Decimal:
        return self.idle_cost - sum((line.idle_cost for line in self.lines), Decimal(0))

    @property
    def balances(self) -> bool:
        parts = (self.request_cost, self.idle_cost, self.load_cost)
        return self.held_cost == sum(parts, Decimal(0)) + self.drain_cost + self.asleep_cost


def cents(value: Decimal) -> Decimal:
    return round_money(value, REPORT_PLACES)


def hours(seconds: Decimal) -> Decimal:
    return MONEY_CONTEXT.divide(seconds, Decimal(SECONDS_PER_HOUR))


def _cost(seconds: Decimal, price: DevicePrice) -> Decimal:
    return cents(MONEY_CONTEXT.multiply(hours(seconds), price.per_hour))


def held_seconds(
    intervals: Iterable[Interval], since: datetime, until: datetime
) -> dict[str, Decimal]:
    """Exact seconds per kind of the intervals' parts inside [since, until)."""
    micros = dict.fromkeys(KINDS, 0)
    for interval in intervals:
        start = max(interval.started_at, since)
        end = min(interval.ended_at, until)
        if end > start:
            micros[STATE_KIND[interval.state]] += (end - start) // _MICROSECOND
    return {kind: Decimal(us).scaleb(-6) for kind, us in micros.items()}


def _signed_split(total: Decimal, weights: Sequence[int]) -> list[Decimal]:
    """`split_exact` in cents, for a negative total too (its magnitude split, then negated)."""
    if not any(weights):
        return [Decimal(0).scaleb(-REPORT_PLACES)] * len(weights)
    shares = split_exact(abs(total), weights, REPORT_PLACES)
    return shares if total >= 0 else [-share for share in shares]


def _micros(value: Decimal, places: int) -> int:
    return int(value.scaleb(places, context=MONEY_CONTEXT).to_integral_value())


def reconcile_pool(
    model: str,
    intervals: Iterable[Interval],
    usage: Sequence[TenantUsage],
    price: DevicePrice,
    since: datetime,
    until: datetime,
) -> PoolDay:
    """The pool's day over [since, until): held time by kind, the costs that balance, the
    tenants' lines (module docstring: the rules)."""
    seconds = held_seconds(intervals, since, until)
    held_cost = _cost(sum(seconds.values(), Decimal(0)), price)
    load_cost = _cost(seconds["load"], price)
    drain_cost = _cost(seconds["drain"], price)
    asleep_cost = _cost(seconds["asleep"], price)
    request_cost = cents(sum((u.device_cost for u in usage), Decimal(0)))
    idle_cost = held_cost - request_cost - load_cost - drain_cost - asleep_cost
    direct = _signed_split(request_cost, [_micros(u.device_cost, 6) for u in usage])
    idle = _signed_split(idle_cost, [_micros(u.busy_seconds, 9) for u in usage])
    lines = tuple(
        TenantLine(
            tenant_id=u.tenant_id,
            busy_seconds=u.busy_seconds,
            revenue=cents(u.revenue),
            device_cost=direct[i],
            idle_cost=idle[i],
        )
        for i, u in enumerate(usage)
    )
    return PoolDay(
        model=model,
        price_per_hour=price.per_hour,
        seconds=seconds,
        busy_seconds=sum((u.busy_seconds for u in usage), Decimal(0)),
        held_cost=held_cost,
        request_cost=request_cost,
        idle_cost=idle_cost,
        load_cost=load_cost,
        drain_cost=drain_cost,
        asleep_cost=asleep_cost,
        lines=lines,
    )
