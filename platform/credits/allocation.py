"""Which grants pay a charge: promo before paid, then the soonest to expire, exactly.

Pure logic (no database), so the order and the arithmetic are tested on their own. Why
this order: promo money is given, and money that expires is lost, so spending those
first leaves the tenant the most of what it paid for, for longest (OpenAI, Lago and
OpenMeter spend the same way).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from hydrant.platform.billing.money import require_money

_NEVER = datetime.max


@dataclass(frozen=True)
class GrantFunds:
    """What is left of one grant, with what orders it among the others."""

    grant_id: str
    kind: str  # "promo" | "paid"
    remaining: Decimal
    expires_at: datetime | None
    created_at: datetime

    def usable_at(self, moment: datetime) -> bool:
        return self.remaining > 0 and (self.expires_at is None or self.expires_at > moment)


def spending_order(grants: Iterable[GrantFunds]) -> list[GrantFunds]:
    """Promo first, then soonest-expiring (no expiry last), then oldest, then by id."""

    def key(grant: GrantFunds) -> tuple[int, datetime, datetime, str]:
        expiry = grant.expires_at.replace(tzinfo=None) if grant.expires_at else _NEVER
        created = grant.created_at.replace(tzinfo=None)
        return (0 if grant.kind == "promo" else 1, expiry, created, grant.grant_id)

    return sorted(grants, key=key)


@dataclass(frozen=True)
class Allocation:
    """A charge split over grants; `unpaid` is what no grant could cover."""

    parts: tuple[tuple[str, Decimal], ...]
    unpaid: Decimal


def allocate(charge: Decimal, grants: Sequence[GrantFunds], at: datetime) -> Allocation:
    """Split `charge` over the grants usable `at`, in spending order, exactly (no rounding:
    every amount is already in micro-units, and a part is a min of two of them)."""
    left = require_money(charge, "charge")
    if left < 0:
        raise ValueError("a charge is never negative")
    parts: list[tuple[str, Decimal]] = []
    for grant in spending_order(g for g in grants if g.usable_at(at)):
        if left == 0:
            break
        part = min(left, grant.remaining)
        parts.append((grant.grant_id, part))
        left -= part
    return Allocation(tuple(parts), left)
