"""A batch's budget reservation, kept on its row so any runner can settle it.

The reservation is an admission of the quota store (`QuotaBackend.admit`) holding the
batch's maximum tokens and cost against the tenant's budgets for the batch's whole
window. Its id and checks are written on the batch row (JSON: ints and strings only,
no money as a float: amounts are tokens or micro-units), so the runner that settles a
line, on this process, another one or after a restart, settles the same reservation.
"""

from __future__ import annotations

from typing import Any

from hydrant.platform.quotas.checks import Admission, BudgetCheck


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


def released(admission: Admission) -> dict[str, int]:
    """The `actual` that settles a reservation's remainder to nothing: each line already
    counted what it used (`settle_part`); what is still held goes back."""
    return {check.name: 0 for check in admission.checks if isinstance(check, BudgetCheck)}
