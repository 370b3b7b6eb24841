"""What a backend is asked to check: typed limit checks, and what comes back.

A request is admitted against several limits at once (per-key rate, tenant
rate, tokens per minute, concurrency, budgets). They are checked and consumed
together, all or nothing, so a request refused by its budget has not used up
a rate-limit slot. Amounts are integers: tokens, requests, or micro-units of
money (`hydrant.platform.billing.to_micro_units`), never floats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from hydrant.errors import HydrantError


class LimitKind(StrEnum):
    RATE = "rate"
    CONCURRENCY = "concurrency"
    BUDGET = "budget"


def _require_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


def _require_seconds(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds")


def _require_name(value: object, name: str) -> None:
    # `split()` cuts on exactly the characters `str.isspace` accepts, in C: a non-empty
    # string without whitespace is the only one that splits into itself. Why not a
    # per-character loop: every request builds several checks, each validating names.
    if not isinstance(value, str) or value.split() != [value]:
        raise ValueError(f"{name} must be a non-empty string without spaces")


@dataclass(frozen=True)
class WindowCheck:
    """At most `limit` units in any sliding `window_s` (requests: amount 1; tokens: reserved)."""

    name: str
    key: str
    limit: int
    window_s: float
    amount: int = 1
    kind: LimitKind = field(default=LimitKind.RATE, init=False)

    def __post_init__(self) -> None:
        _require_name(self.name, "name")
        _require_name(self.key, "key")
        _require_int(self.limit, "limit")
        _require_int(self.amount, "amount")
        _require_seconds(self.window_s, "window_s")


@dataclass(frozen=True)
class ConcurrencyCheck:
    """At most `limit` requests in flight; each holds a slot leased for `lease_s` (renewable)."""

    name: str
    key: str
    limit: int
    lease_s: float = 300.0
    retry_after_s: float = 1.0
    kind: LimitKind = field(default=LimitKind.CONCURRENCY, init=False)

    def __post_init__(self) -> None:
        _require_name(self.name, "name")
        _require_name(self.key, "key")
        _require_int(self.limit, "limit")
        _require_seconds(self.lease_s, "lease_s")
        _require_seconds(self.retry_after_s, "retry_after_s")


@dataclass(frozen=True)
class BudgetCheck:
    """Spent + reserved + `amount` must stay within `limit` until `period_end` (epoch s).

    The request's maximum cost is reserved at admission and settled to the actual
    cost afterwards, so concurrent requests can never overspend; an unsettled
    reservation is dropped after `lease_s` (a crashed gateway does not hold it).

    `floor`: what the durable record (the database) says is already spent; the store's
    `spent` is raised to it before the check, so a store that lost its state (a Redis
    restart) never counts less than what was really spent (prepaid credits use it).
    """

    name: str
    key: str
    limit: int
    amount: int
    period_end: float
    lease_s: float = 900.0
    floor: int = 0
    kind: LimitKind = field(default=LimitKind.BUDGET, init=False)

    def __post_init__(self) -> None:
        _require_name(self.name, "name")
        _require_name(self.key, "key")
        _require_int(self.limit, "limit")
        _require_int(self.amount, "amount")
        _require_int(self.floor, "floor")
        _require_seconds(self.lease_s, "lease_s")
        if isinstance(self.period_end, bool) or not isinstance(self.period_end, int | float):
            raise TypeError("period_end must be epoch seconds")


Check = WindowCheck | ConcurrencyCheck | BudgetCheck


def validate_checks(checks: Sequence[Check]) -> tuple[Check, ...]:
    """The checks as a tuple; names and keys must be unique (both are used as identities)."""
    result = tuple(checks)
    for check in result:
        if not isinstance(check, WindowCheck | ConcurrencyCheck | BudgetCheck):
            raise TypeError(f"not a quota check: {type(check).__name__}")
    if len({c.name for c in result}) != len(result):
        raise ValueError("check names must be unique")
    if len({c.key for c in result}) != len(result):
        raise ValueError("check keys must be unique")
    return result


@dataclass(frozen=True)
class Refusal:
    """Which limit refused, and when retrying can help (None: waiting will not help)."""

    limit_name: str
    kind: LimitKind
    limit: int
    retry_after_s: float | None

    @property
    def retry_after_header(self) -> int | None:
        """Whole seconds for an HTTP `Retry-After` header (at least 1)."""
        if self.retry_after_s is None:
            return None
        return max(1, math.ceil(self.retry_after_s))


@dataclass(frozen=True)
class WindowState:
    """A window limit as the same admission left it: what remains of `limit`, and in how
    many seconds its oldest entry leaves the window (capacity next comes back; 0: empty).

    Why the backend returns it from the admit call itself: OpenAI's `x-ratelimit-*` headers
    go on every response, and asking the store again would double its round trips."""

    name: str
    limit: int
    remaining: int
    reset_s: float


class QuotaExceeded(HydrantError):
    """The request was refused; nothing was consumed. `refusal` is the binding one;
    `windows` the state of the request's window limits (for the rate-limit headers)."""

    def __init__(self, refusals: Sequence[Refusal], windows: Sequence[WindowState] = ()) -> None:
        if not refusals:
            raise ValueError("QuotaExceeded needs at least one refusal")
        self.refusals = tuple(refusals)
        self.windows = tuple(windows)
        hopeless = [r for r in self.refusals if r.retry_after_s is None]
        self.refusal = (
            hopeless[0] if hopeless else max(self.refusals, key=lambda r: r.retry_after_s or 0.0)
        )
        super().__init__(f"quota {self.refusal.limit_name!r} exceeded")


class QuotaBackendUnavailable(HydrantError):
    """The quota store cannot be reached; admission cannot be decided."""


@dataclass
class Admission:
    """A granted admission: hand it back to `settle` exactly once when the request ends.

    `metered` is False when the backend was down and the policy is to fail open:
    nothing was recorded, so there is nothing to settle.
    """

    reservation_id: str
    checks: tuple[Check, ...]
    metered: bool = True
    settled: bool = False
    windows: tuple[WindowState, ...] = ()  # the window limits after this admission


@dataclass(frozen=True)
class LimitUsage:
    """How much of a limit is taken now: settled use and outstanding reservations."""

    used: int
    reserved: int = 0


def resolve_actuals(admission: Admission, actual: Mapping[str, int] | None) -> list[int | None]:
    """Per check, the amount to settle to; None keeps what was recorded at admission.

    A window or budget not named in `actual` keeps its reserved amount (the safe
    side: an omission over-counts, never under-counts). Concurrency slots have no
    amount: settling always frees them.
    """
    given = dict(actual or {})
    by_name = {c.name: c for c in admission.checks}
    unknown = set(given) - set(by_name)
    if unknown:
        raise ValueError(f"unknown checks in actual: {', '.join(sorted(unknown))}")
    resolved: list[int | None] = []
    for check in admission.checks:
        if isinstance(check, ConcurrencyCheck):
            if check.name in given:
                raise ValueError(f"{check.name} is a concurrency slot: it takes no amount")
            resolved.append(None)
        elif check.name in given:
            resolved.append(_require_int(given[check.name], check.name))
        else:
            resolved.append(check.amount if isinstance(check, BudgetCheck) else None)
    return resolved
