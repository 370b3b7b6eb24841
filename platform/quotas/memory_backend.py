"""The in-process quota store of the embedded default: same decisions as Redis, no server.

Why no lock: every operation runs to completion without awaiting, so on one
event loop it is already atomic. A state object is dropped once it holds
nothing, so the dictionaries only hold what is live.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hydrant.platform.quotas.checks import (
    Admission,
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    LimitUsage,
    QuotaExceeded,
    Refusal,
    WindowCheck,
    WindowState,
    resolve_actuals,
    validate_checks,
)

BUDGET_BLOCKED_BY_RESERVATIONS_RETRY_S = 1.0
SWEEP_EVERY_S = 60.0


@dataclass
class _Window:
    entries: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)
    total: int = 0
    window_s: float = 0.0

    def expire(self, now: float, window_s: float) -> None:
        while self.entries:
            rid, (ts, weight) = next(iter(self.entries.items()))
            if ts > now - window_s:
                break
            del self.entries[rid]
            self.total -= weight

    def retry_after(self, amount: int, limit: int, now: float, window_s: float) -> float | None:
        if amount > limit:
            return None
        need, freed = self.total + amount - limit, 0
        for ts, weight in self.entries.values():
            freed += weight
            if freed >= need:
                return ts + window_s - now
        return None  # unreachable while total is consistent


@dataclass
class _Budget:
    spent: int = 0
    reserved: int = 0
    leases: dict[str, tuple[float, int]] = field(default_factory=dict)  # rid -> (expiry, amount)
    period_end: float = 0.0
    # Long-lived reservations (`resync`): rid -> the version last applied, and what that
    # reservation has counted as spent in all.
    versions: dict[str, int] = field(default_factory=dict)
    counted: dict[str, int] = field(default_factory=dict)

    def expire(self, now: float) -> None:
        for rid in [r for r, (expiry, _) in self.leases.items() if expiry <= now]:
            self.reserved -= self.leases.pop(rid)[1]


class InMemoryQuotaBackend:
    """`QuotaBackend` over plain dictionaries; `clock` is epoch seconds (injected in tests)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._slots: dict[str, dict[str, float]] = {}  # key -> rid -> lease expiry
        self._budgets: dict[str, _Budget] = {}
        self._next_sweep = 0.0

    async def admit(self, checks: Sequence[Check], reservation_id: str | None = None) -> Admission:
        plan = validate_checks(checks)
        now = self._clock()
        for check in plan:
            if isinstance(check, BudgetCheck) and check.floor > 0:
                budget = self._budgets.setdefault(check.key, _Budget(period_end=check.period_end))
                budget.spent = max(budget.spent, check.floor)
        refusals = [r for r in (self._evaluate(c, now) for c in plan) if r is not None]
        if refusals:
            raise QuotaExceeded(refusals, self._window_states(plan, now))
        rid = reservation_id or uuid.uuid4().hex
        for check in plan:
            self._consume(check, rid, now)
        self._sweep(now)
        return Admission(reservation_id=rid, checks=plan, windows=self._window_states(plan, now))

    def _window_states(self, checks: Sequence[Check], now: float) -> tuple[WindowState, ...]:
        states = []
        for check in checks:
            if not isinstance(check, WindowCheck):
                continue
            window = self._windows.get(check.key) or _Window()
            reset = 0.0
            if window.entries:
                reset = max(0.0, next(iter(window.entries.values()))[0] + check.window_s - now)
            remaining = max(0, check.limit - window.total)
            states.append(WindowState(check.name, check.limit, remaining, reset))
        return tuple(states)

    def _evaluate(self, check: Check, now: float) -> Refusal | None:
        if isinstance(check, WindowCheck):
            window = self._windows.get(check.key) or _Window()
            window.expire(now, check.window_s)
            if window.total + check.amount <= check.limit:
                return None
            retry = window.retry_after(check.amount, check.limit, now, check.window_s)
        elif isinstance(check, ConcurrencyCheck):
            slots = self._live_slots(check.key, now)
            if len(slots) + 1 <= check.limit:
                return None
            retry = check.retry_after_s
        else:
            budget = self._budgets.get(check.key) or _Budget()
            budget.expire(now)
            if budget.spent + budget.reserved + check.amount <= check.limit:
                return None
            retry = _budget_retry(check, budget.spent, now)
        return Refusal(check.name, check.kind, check.limit, retry)

    def _live_slots(self, key: str, now: float) -> dict[str, float]:
        slots = self._slots.get(key, {})
        for rid in [r for r, expiry in slots.items() if expiry <= now]:
            del slots[rid]
        return slots

    def _consume(self, check: Check, rid: str, now: float) -> None:
        if isinstance(check, WindowCheck):
            window = self._windows.setdefault(check.key, _Window())
            window.window_s = check.window_s
            window.entries[rid] = (now, check.amount)
            window.total += check.amount
        elif isinstance(check, ConcurrencyCheck):
            self._slots.setdefault(check.key, {})[rid] = now + check.lease_s
        else:
            budget = self._budgets.setdefault(check.key, _Budget())
            budget.period_end = check.period_end
            budget.leases[rid] = (now + check.lease_s, check.amount)
            budget.reserved += check.amount

    async def settle(self, admission: Admission, actual: Mapping[str, int] | None = None) -> None:
        amounts = resolve_actuals(admission, actual)
        if admission.settled or not admission.metered:
            admission.settled = True
            return
        rid = admission.reservation_id
        for check, amount in zip(admission.checks, amounts, strict=True):
            if isinstance(check, WindowCheck):
                window = self._windows.get(check.key)
                entry = window.entries.get(rid) if window else None
                if window is not None and entry is not None and amount is not None:
                    window.entries[rid] = (entry[0], amount)
                    window.total += amount - entry[1]
            elif isinstance(check, ConcurrencyCheck):
                self._slots.get(check.key, {}).pop(rid, None)
            else:
                budget = self._budgets.setdefault(check.key, _Budget(period_end=check.period_end))
                lease = budget.leases.pop(rid, None)
                if lease is not None:
                    budget.reserved -= lease[1]
                budget.spent += amount or 0
        admission.settled = True
        self._sweep(self._clock())

    async def resync(
        self,
        admission: Admission,
        version: int,
        held: Mapping[str, int],
        spent: Mapping[str, int],
    ) -> None:
        if admission.settled or not admission.metered:
            return
        now, rid = self._clock(), admission.reservation_id
        for check in admission.checks:
            if not isinstance(check, BudgetCheck):
                continue
            budget = self._budgets.setdefault(check.key, _Budget(period_end=check.period_end))
            budget.expire(now)
            if budget.versions.get(rid, -1) >= version:
                continue  # a newer (or the same) state is already here
            budget.versions[rid] = version
            lease = budget.leases.pop(rid, None)
            want = max(0, int(held.get(check.name, 0)))
            budget.reserved += want - (lease[1] if lease is not None else 0)
            if want > 0:
                budget.leases[rid] = (lease[0] if lease else now + check.lease_s, want)
            total = max(0, int(spent.get(check.name, 0)))
            budget.spent += total - budget.counted.get(rid, 0)
            budget.counted[rid] = total

    async def renew(self, admission: Admission) -> bool:
        if admission.settled or not admission.metered:
            return False
        now, rid, held = self._clock(), admission.reservation_id, True
        for check in admission.checks:
            if isinstance(check, ConcurrencyCheck):
                slots = self._live_slots(check.key, now)
                if rid in slots:
                    slots[rid] = now + check.lease_s
                else:
                    held = False
            elif isinstance(check, BudgetCheck):
                budget = self._budgets.get(check.key)
                lease = budget.leases.get(rid) if budget else None
                if budget is not None and lease is not None and lease[0] > now:
                    budget.leases[rid] = (now + check.lease_s, lease[1])
                else:
                    held = False
        return held

    async def usage(self, check: Check) -> LimitUsage:
        now = self._clock()
        if isinstance(check, WindowCheck):
            window = self._windows.get(check.key)
            if window is None:
                return LimitUsage(used=0)
            window.expire(now, check.window_s)
            return LimitUsage(used=window.total)
        if isinstance(check, ConcurrencyCheck):
            return LimitUsage(used=len(self._live_slots(check.key, now)))
        budget = self._budgets.get(check.key)
        if budget is None:
            return LimitUsage(used=0)
        budget.expire(now)
        return LimitUsage(used=budget.spent, reserved=budget.reserved)

    def _sweep(self, now: float) -> None:
        """Now and then, drop state that holds nothing live (ended periods, idle windows)."""
        if now < self._next_sweep:
            return
        self._next_sweep = now + SWEEP_EVERY_S
        for window in self._windows.values():
            window.expire(now, window.window_s)
        for key in [k for k, w in self._windows.items() if not w.entries]:
            del self._windows[key]
        for key in list(self._slots):
            self._live_slots(key, now)
        for key in [k for k, s in self._slots.items() if not s]:
            del self._slots[key]
        for budget in self._budgets.values():
            budget.expire(now)
        for key in [k for k, b in self._budgets.items() if b.period_end <= now and not b.leases]:
            del self._budgets[key]

    async def aclose(self) -> None:
        self._windows.clear()
        self._slots.clear()
        self._budgets.clear()


def _budget_retry(check: BudgetCheck, spent: int, now: float) -> float | None:
    """None when the request alone exceeds the budget; soon when only reservations block it."""
    if check.amount > check.limit:
        return None
    if spent + check.amount <= check.limit:
        return BUDGET_BLOCKED_BY_RESERVATIONS_RETRY_S
    return max(check.period_end - now, BUDGET_BLOCKED_BY_RESERVATIONS_RETRY_S)
