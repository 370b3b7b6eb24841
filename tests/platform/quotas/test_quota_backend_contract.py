"""The contract both quota backends satisfy: the same suite runs on memory and on real Redis."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from quota_helpers import ManualClock

from hydrant.platform.quotas import (
    Admission,
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    LimitKind,
    LimitUsage,
    QuotaBackend,
    QuotaExceeded,
    TenantQuota,
    WindowCheck,
    WindowState,
    build_checks,
    classify,
    settle_amounts,
)
from hydrant.platform.quotas.policy import KeyQuota, ProjectQuota
from hydrant.platform.quotas.rate_headers import rate_limit_headers

DAY_END = 1_750_000_000.0 + 3_600.0


def rate(
    limit: int = 3, window: float = 1.0, amount: int = 1, key: str = "{t1}:rps"
) -> WindowCheck:
    return WindowCheck("rate", key, limit, window, amount)


def budget(amount: int, limit: int = 100, lease: float = 900.0) -> BudgetCheck:
    return BudgetCheck("budget", "{t1}:tokens:day", limit, amount, DAY_END, lease)


async def refused(backend: QuotaBackend, *checks: Check) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as info:
        await backend.admit(list(checks))
    return info.value


async def test_window_admits_up_to_the_limit_then_says_when(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    for _ in range(3):
        await backend.admit([rate()])
        clock.advance(0.1)
    error = await refused(backend, rate())
    assert error.refusal.limit_name == "rate"
    assert error.refusal.kind is LimitKind.RATE
    assert error.refusal.limit == 3
    assert error.refusal.retry_after_s == pytest.approx(0.7, abs=0.002)
    assert error.refusal.retry_after_header == 1
    clock.advance(0.69)
    await refused(backend, rate())
    clock.advance(0.011)  # the first entry is now exactly one window old
    await backend.admit([rate()])
    assert await backend.usage(rate()) == LimitUsage(used=3)


async def test_window_slides_rather_than_resets(backend: QuotaBackend, clock: ManualClock) -> None:
    check = rate(limit=2, window=10.0)
    await backend.admit([check])
    clock.advance(6)
    await backend.admit([check])
    clock.advance(5)  # the first admission has left the window, the second has 5 s to go
    await backend.admit([check])
    error = await refused(backend, check)
    assert error.refusal.retry_after_s == pytest.approx(5.0, abs=0.002)


async def test_token_window_is_weighted_and_settles_to_actual(backend: QuotaBackend) -> None:
    check60, check50 = rate(limit=100, window=60, amount=60), rate(limit=100, window=60, amount=50)
    first = await backend.admit([check60])
    error = await refused(backend, check50)
    assert error.refusal.retry_after_s == pytest.approx(60.0, abs=0.002)
    await backend.settle(first, {"rate": 20})
    assert await backend.usage(check60) == LimitUsage(used=20)
    await backend.admit([check50])
    assert await backend.usage(check60) == LimitUsage(used=70)


async def test_amount_above_the_limit_can_never_pass(backend: QuotaBackend) -> None:
    error = await refused(backend, rate(limit=10, amount=11), budget(101))
    assert [r.retry_after_s for r in error.refusals] == [None, None]
    assert error.refusal.retry_after_header is None


async def test_refusal_consumes_nothing_anywhere(backend: QuotaBackend) -> None:
    window, slots, spend = rate(limit=5), ConcurrencyCheck("slots", "{t1}:c", 5), budget(90)
    await backend.admit([spend])
    error = await refused(backend, window, slots, budget(20))
    assert [r.limit_name for r in error.refusals] == ["budget"]
    assert await backend.usage(window) == LimitUsage(used=0)
    assert await backend.usage(slots) == LimitUsage(used=0)
    assert await backend.usage(spend) == LimitUsage(used=0, reserved=90)


async def test_binding_refusal_has_the_longest_wait(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    short, long = rate(limit=1, window=1, key="{t1}:a"), rate(limit=1, window=30, key="{t1}:b")
    short = WindowCheck("short", short.key, 1, 1.0)
    long = WindowCheck("long", long.key, 1, 30.0)
    await backend.admit([short, long])
    error = await refused(backend, short, long)
    assert {r.limit_name for r in error.refusals} == {"short", "long"}
    assert error.refusal.limit_name == "long"


async def test_concurrency_slots_are_freed_by_settle(backend: QuotaBackend) -> None:
    slots = ConcurrencyCheck("slots", "{t1}:c", 2, lease_s=60, retry_after_s=2.0)
    first = await backend.admit([slots])
    await backend.admit([slots])
    error = await refused(backend, slots)
    assert (error.refusal.kind, error.refusal.retry_after_s) == (LimitKind.CONCURRENCY, 2.0)
    await backend.settle(first)
    await backend.admit([slots])
    assert await backend.usage(slots) == LimitUsage(used=2)


async def test_a_crashed_holder_loses_its_slot_at_lease_end(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    slots = ConcurrencyCheck("slots", "{t1}:c", 1, lease_s=10)
    await backend.admit([slots])  # never settled: its gateway "crashed"
    clock.advance(9.9)
    await refused(backend, slots)
    clock.advance(0.1)
    await backend.admit([slots])


async def test_renew_extends_leases_until_they_expire(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    slots = ConcurrencyCheck("slots", "{t1}:c", 1, lease_s=10)
    held = await backend.admit([slots, budget(10, lease=10)])
    clock.advance(8)
    assert await backend.renew(held) is True
    clock.advance(8)
    await refused(backend, slots)
    assert await backend.usage(budget(0)) == LimitUsage(used=0, reserved=10)
    clock.advance(3)
    assert await backend.renew(held) is False
    assert await backend.usage(budget(0)) == LimitUsage(used=0, reserved=0)
    await backend.admit([slots])


async def test_budget_reserves_the_maximum_then_settles_to_actual(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    a = await backend.admit([budget(40)])
    b = await backend.admit([budget(40)])
    error = await refused(backend, budget(40))
    assert error.refusal.kind is LimitKind.BUDGET
    assert error.refusal.retry_after_s == 1.0  # only reservations block: they settle soon
    await backend.settle(a, {"budget": 10})
    assert await backend.usage(budget(0)) == LimitUsage(used=10, reserved=40)
    c = await backend.admit([budget(40)])
    await backend.settle(b, {"budget": 40})
    await backend.settle(c, {"budget": 45})  # actual may exceed the reservation: it is recorded
    assert await backend.usage(budget(0)) == LimitUsage(used=95, reserved=0)
    error = await refused(backend, budget(10))
    assert error.refusal.retry_after_s == pytest.approx(DAY_END - clock.now, abs=0.002)
    await backend.admit([budget(5)])


async def test_a_long_lived_reservation_is_brought_to_its_durable_state(
    backend: QuotaBackend,
) -> None:
    """A batch's reservation: after each stored line the store is set to what the batch's
    row says (held, spent in all) under a version; an older or repeated version changes
    nothing; the end (nothing held) gives the rest back and keeps what was used."""
    slots = ConcurrencyCheck("slots", "{t1}:c", 3)
    batch = await backend.admit([budget(60), slots])
    await backend.resync(batch, 1, {"budget": 40}, {"budget": 7})
    assert await backend.usage(budget(0)) == LimitUsage(used=7, reserved=40)
    await refused(backend, budget(60))  # still held: 7 + 40 + 60 > 100
    await backend.admit([budget(50)])  # what the line gave back is free again
    await backend.resync(batch, 1, {"budget": 10}, {"budget": 30})  # a retry: no change
    await backend.resync(batch, 0, {"budget": 60}, {"budget": 0})  # late, older: no change
    assert await backend.usage(budget(0)) == LimitUsage(used=7, reserved=90)
    await backend.resync(batch, 3, {"budget": 20}, {"budget": 10})
    await backend.resync(batch, 2, {"budget": 30}, {"budget": 9})  # arrives after 3
    assert await backend.usage(budget(0)) == LimitUsage(used=10, reserved=70)
    assert await backend.usage(slots) == LimitUsage(used=1)  # windows and slots untouched
    await backend.resync(batch, 2**52, {"budget": 0}, {"budget": 10})  # the batch's end
    assert await backend.usage(budget(0)) == LimitUsage(used=10, reserved=50)
    await backend.resync(batch, 4, {"budget": 5}, {"budget": 12})  # nothing after the end
    assert await backend.usage(budget(0)) == LimitUsage(used=10, reserved=50)


async def test_a_store_that_lost_a_reservation_gets_it_back_whole(backend: QuotaBackend) -> None:
    """After a restart of the in-memory store (or Redis without persistence) the batch's
    runner resyncs its reservation: held again and its lines' use counted, exactly once."""
    lost = Admission(reservation_id="batch-lost", checks=(budget(60),))  # never admitted here
    await backend.resync(lost, 3, {"budget": 25}, {"budget": 9})
    await backend.resync(lost, 3, {"budget": 25}, {"budget": 9})  # a second runner's call
    assert await backend.usage(budget(0)) == LimitUsage(used=9, reserved=25)
    await refused(backend, budget(70))  # 9 + 25 + 70 > 100: the batch's hold counts
    await backend.resync(lost, 4, {"budget": 0}, {"budget": 12})
    assert await backend.usage(budget(0)) == LimitUsage(used=12, reserved=0)


async def test_settle_without_actuals_keeps_the_reservation_as_spent(backend: QuotaBackend) -> None:
    admission = await backend.admit([budget(30), rate(limit=100, amount=7)])
    await backend.settle(admission)
    assert await backend.usage(budget(0)) == LimitUsage(used=30, reserved=0)
    assert await backend.usage(rate()) == LimitUsage(used=7)


async def test_an_abandoned_reservation_is_released_at_lease_end(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    await backend.admit([budget(80, lease=30)])
    await refused(backend, budget(30))
    clock.advance(30)
    await backend.admit([budget(30)])
    assert await backend.usage(budget(0)) == LimitUsage(used=0, reserved=30)


async def test_settle_is_once_per_admission(backend: QuotaBackend) -> None:
    slots = ConcurrencyCheck("slots", "{t1}:c", 3)
    admission = await backend.admit([budget(20), slots])
    await backend.settle(admission, {"budget": 5})
    await backend.settle(admission, {"budget": 5})
    assert admission.settled
    assert await backend.usage(budget(0)) == LimitUsage(used=5, reserved=0)
    assert await backend.usage(slots) == LimitUsage(used=0)
    assert await backend.renew(admission) is False


async def test_settle_refuses_unknown_or_meaningless_amounts(backend: QuotaBackend) -> None:
    slots = ConcurrencyCheck("slots", "{t1}:c", 3)
    admission = await backend.admit([budget(20), slots])
    with pytest.raises(ValueError, match="unknown"):
        await backend.settle(admission, {"nope": 1})
    with pytest.raises(ValueError, match="concurrency"):
        await backend.settle(admission, {"slots": 1})
    with pytest.raises(ValueError):
        await backend.settle(admission, {"budget": -1})
    assert not admission.settled


async def test_zero_limit_blocks_and_empty_checks_pass(backend: QuotaBackend) -> None:
    await refused(backend, rate(limit=0))
    admission = await backend.admit([])
    assert admission.checks == ()
    await backend.settle(admission)


async def test_duplicate_names_or_keys_are_refused(backend: QuotaBackend) -> None:
    with pytest.raises(ValueError, match="names"):
        await backend.admit([rate(key="{t1}:a"), rate(key="{t1}:b")])
    with pytest.raises(ValueError, match="keys"):
        await backend.admit([rate(), WindowCheck("other", "{t1}:rps", 1, 1.0)])


async def test_usage_of_an_untouched_limit_is_zero(backend: QuotaBackend) -> None:
    assert await backend.usage(rate()) == LimitUsage(used=0)
    assert await backend.usage(budget(1)) == LimitUsage(used=0, reserved=0)
    assert await backend.usage(ConcurrencyCheck("s", "{t1}:c", 1)) == LimitUsage(used=0)


async def test_admit_reports_each_window_as_it_left_it(
    backend: QuotaBackend, clock: ManualClock
) -> None:
    """What the rate-limit headers read comes back from the admit call itself."""
    tokens = WindowCheck("tokens", "{t1}:tpm", 100, 60.0, 30)
    first = await backend.admit([rate(limit=3, window=10.0), tokens, budget(5)])
    assert first.windows == (
        WindowState("rate", 3, 2, 10.0),
        WindowState("tokens", 100, 70, 60.0),
    )
    clock.advance(4)
    second = await backend.admit([rate(limit=3, window=10.0), tokens])
    assert [(w.remaining, w.reset_s) for w in second.windows] == [(1, 6.0), (40, 56.0)]
    await backend.admit([rate(limit=3, window=10.0)])
    error = await refused(backend, rate(limit=3, window=10.0), tokens)
    assert error.windows == (
        WindowState("rate", 3, 0, 6.0),
        WindowState("tokens", 100, 40, 56.0),
    )
    assert error.refusal.retry_after_s == pytest.approx(6.0)


async def test_a_budget_never_counts_less_than_its_floor(backend: QuotaBackend) -> None:
    """A store that lost its state is raised to what the database says was spent."""
    floored = BudgetCheck("credit", "{t1}:credit", 100, 30, DAY_END, 900.0, floor=60)
    await backend.admit([floored])
    assert await backend.usage(floored) == LimitUsage(used=60, reserved=30)
    error = await refused(backend, BudgetCheck("credit", "{t1}:credit", 100, 11, DAY_END))
    assert error.refusal.limit_name == "credit"
    lower = BudgetCheck("credit", "{t1}:credit", 100, 10, DAY_END, 900.0, floor=20)
    await backend.admit([lower])  # a stale, lower floor takes nothing back
    assert await backend.usage(lower) == LimitUsage(used=60, reserved=40)


async def test_a_project_budget_stricter_than_the_tenants_refuses_first(
    backend: QuotaBackend,
) -> None:
    """A project's budgets ride in the same atomic call as the tenant's (quotas/plan.py):
    its own counter refuses while the tenant's has room, and a refusal reserves nothing
    in either; another project of the tenant is untouched."""
    at = datetime(2026, 12, 5, 12, tzinfo=UTC)
    tenant = TenantQuota(tokens_per_day=1_000)

    def checks(project: str, limit: int) -> tuple[Check, ...]:
        return build_checks(
            tenant_id="t1",
            key_id="k1",
            tier=classify(10, 10),
            quota=tenant,
            reserve_tokens=20,
            reserve_money=Decimal(0),
            at=at,
            project=ProjectQuota(project, tokens_per_day=limit),
        )

    first = await backend.admit(checks("proj_a", 30))
    await backend.settle(first, settle_amounts(first, tokens=20, money=Decimal(0)))
    error = await refused(backend, *checks("proj_a", 30))
    assert error.refusal.limit_name == "project_tokens_day"
    tenant_day, project_day = (
        next(c for c in checks("proj_a", 30) if c.name == name)
        for name in ("tokens_day", "project_tokens_day")
    )
    assert await backend.usage(tenant_day) == LimitUsage(used=20, reserved=0)
    assert await backend.usage(project_day) == LimitUsage(used=20, reserved=0)
    await backend.admit(checks("proj_b", 30))  # another project: its own counter


async def test_a_project_rate_refuses_and_names_itself_in_the_headers(
    backend: QuotaBackend,
) -> None:
    at = datetime(2026, 12, 5, 12, tzinfo=UTC)

    def checks() -> tuple[Check, ...]:
        return build_checks(
            tenant_id="t1",
            key_id="k1",
            tier=classify(10, 10),
            quota=TenantQuota(requests_per_minute=100),
            reserve_tokens=20,
            reserve_money=Decimal(0),
            at=at,
            project=ProjectQuota("proj_a", requests_per_minute=2),
        )

    admitted = await backend.admit(checks())
    # The tighter per-minute window (the project's, 1 left) is what the headers describe.
    assert rate_limit_headers(admitted.windows)["x-ratelimit-remaining-requests"] == "1"
    await backend.admit(checks())
    error = await refused(backend, *checks())
    assert error.refusal.limit_name == "project_rpm"
    headers = rate_limit_headers(error.windows, "project_rpm", error.refusal.retry_after_s)
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-remaining-requests"]) == (
        "2",
        "0",
    )


async def test_a_key_budget_refuses_while_its_project_and_tenant_have_room(
    backend: QuotaBackend,
) -> None:
    at = datetime(2026, 12, 5, 12, tzinfo=UTC)

    def checks(key_id: str) -> tuple[Check, ...]:
        return build_checks(
            tenant_id="t1",
            key_id=key_id,
            tier=classify(1000, 24),  # the limited tier: its per-key rate is checked too
            quota=TenantQuota(tokens_per_day=1_000),
            reserve_tokens=20,
            reserve_money=Decimal(0),
            at=at,
            project=ProjectQuota("proj_a", tokens_per_day=500),
            key_quota=KeyQuota(key_id, tokens_per_day=30),
        )

    await backend.admit(checks("k1"))
    error = await refused(backend, *checks("k1"))
    assert error.refusal.limit_name == "key_tokens_day"
    await backend.admit(checks("k2"))  # another key of the same project: its own budget
