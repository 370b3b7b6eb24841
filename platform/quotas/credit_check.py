"""Prepaid credits at admission: the request's maximum cost reserved against the balance.

Why a budget check: it is the same reserve-then-settle the spend budgets use (atomic in
one Lua call on Redis across gateways, in one step in memory), so concurrent requests
from many gateways can never hold more than the balance. The balance is not copied into
the store: the check's limit is everything the tenant's grants ever made spendable
(what is left of live grants plus what was spent), its `spent` what was spent, raised
to the database's own sum (`floor`) so a store that lost its state never forgets spend.
What a tenant may still reserve is then limit - spent - reserved = its balance, less
what requests in flight hold. The credits domain (platform/credits) supplies the
standing; this module only turns it into a check.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Protocol

from hydrant.platform.billing import to_micro_units
from hydrant.platform.quotas.checks import BudgetCheck

CREDIT = "credit"
# Credits do not renew with a period: the check's "period" only bounds the key's life in
# the store, and is pushed forward by every admission.
CREDIT_HORIZON = timedelta(days=400)


@dataclass(frozen=True)
class CreditStanding:
    """A tenant's credits as the database has them: `limit` what its grants ever made
    spendable, `spent` what its ledger entries used of it, in `currency`."""

    limit: Decimal
    spent: Decimal
    currency: str = "USD"

    @property
    def balance(self) -> Decimal:
        return max(Decimal(0), self.limit - self.spent)


NO_CREDITS = CreditStanding(Decimal(0), Decimal(0))


class CreditSource(Protocol):
    async def standing(self, tenant_id: str) -> CreditStanding:
        """The tenant's credits now, from the database or a copy at most a second old
        (safe: a stale copy only under-states what may be spent, save for a void)."""
        ...

    def forget(self, tenant_id: str) -> None:
        """Drop the tenant's copy after a credit refusal: a top-up counts at the next try."""
        ...


def credit_check(
    tag: str, standing: CreditStanding, reserve: Decimal, at: datetime, lease_s: float = 900.0
) -> BudgetCheck:
    """The check reserving `reserve` (the request's maximum cost) against the credits of
    the tenant whose `{tenant}` hash tag is `tag`."""
    return BudgetCheck(
        CREDIT,
        f"{tag}:credit",
        to_micro_units(standing.limit),
        to_micro_units(reserve),
        (at + CREDIT_HORIZON).timestamp(),
        lease_s,
        floor=to_micro_units(standing.spent),
    )
