"""A batch's budget reservation, kept on its row so any runner can settle it.

The reservation is an admission of the quota store (`QuotaBackend.admit`) holding the
batch's maximum tokens and cost against the budgets of the tenant, of the key's project
and of the key itself for the batch's whole window. Its id and checks are written on the
batch row (JSON: ints and strings only, no money as a float: amounts are tokens or
micro-units), so the runner that settles a line, on this process, another one or after a
restart, settles the same reservation.

What it holds and what its lines used are the row's too (`held_*`, `spent_*`, changed
in each stored line's own transaction and counted by `quota_version`), and the store
is brought to that state (`QuotaBackend.resync`) after each line, when a runner takes
the batch up and when it ends. Why the row and not the store: a line is stored exactly
once, so its share is given back and its use counted exactly once, whatever dies when;
and an in-memory store (the embedded default) restarted empty gets the reservation back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydrant.platform.db.batch_models import Batch
from hydrant.platform.quotas import QuotaBackend
from hydrant.platform.quotas.checks import Admission, BudgetCheck
from hydrant.platform.quotas.plan import budget_amounts

# The version of a batch's end: above any line's, so nothing after it changes the store.
FINAL_VERSION = 2**52


def to_json(admission: Admission) -> dict[str, Any]:
    checks = [
        {
            "name": check.name,
            "key": check.key,
            "limit": check.limit,
            "amount": check.amount,
            "period_end": check.period_end,
            "lease_s": check.lease_s,
        }
        for check in admission.checks
        if isinstance(check, BudgetCheck)
    ]
    return {"id": admission.reservation_id, "metered": admission.metered, "checks": checks}


def from_json(value: dict[str, Any] | None) -> Admission | None:
    if not value:
        return None
    checks = tuple(
        BudgetCheck(
            str(c["name"]),
            str(c["key"]),
            int(c["limit"]),
            int(c["amount"]),
            float(c["period_end"]),
            float(c["lease_s"]),
        )
        for c in value["checks"]
    )
    return Admission(
        reservation_id=str(value["id"]), checks=checks, metered=bool(value.get("metered", True))
    )


@dataclass(frozen=True)
class HeldState:
    """A batch reservation's durable state, as of `version` (its stored lines' count)."""

    version: int
    held_tokens: int
    held_micros: int
    spent_tokens: int
    spent_micros: int

    @classmethod
    def of(cls, batch: Batch) -> HeldState:
        return cls(
            batch.quota_version,
            batch.held_tokens,
            batch.held_micros,
            batch.input_tokens + batch.output_tokens,
            batch.spent_micros,
        )

    def ended(self) -> HeldState:
        """The state a batch ends in: nothing held any more, what was used stays counted."""
        return HeldState(FINAL_VERSION, 0, 0, self.spent_tokens, self.spent_micros)


async def resync(
    backend: QuotaBackend, reservation: dict[str, Any] | None, state: HeldState
) -> None:
    """Bring the store's copy of the reservation to `state` (nothing without one)."""
    admission = from_json(reservation)
    if admission is None:
        return
    held = budget_amounts(admission, tokens=state.held_tokens, micros=state.held_micros)
    spent = budget_amounts(admission, tokens=state.spent_tokens, micros=state.spent_micros)
    await backend.resync(admission, state.version, held, spent)


async def release_unused(backend: QuotaBackend, reservation: dict[str, Any] | None) -> None:
    """Give back whole a reservation no line used (a batch not made, or whose creation
    was cut short: admitted or not, nothing is held after this)."""
    await resync(backend, reservation, HeldState(FINAL_VERSION, 0, 0, 0, 0))
