"""The Redis quota store: many gateways share limits through atomic Lua scripts.

Keys are `<prefix>:<check key>:<part>`. Check keys built by `plan.build_checks`
start with a `{tenant}` hash tag, so all keys of one admission live in one
Redis Cluster slot and one script may touch them. Every key carries a TTL, so
abandoned limits disappear on their own. A connection failure or timeout
becomes `QuotaBackendUnavailable`; what to do then is the guard's decision
(`guard.GuardedQuotaBackend`), not this class's. A reply lost to a timeout can
hide a script that ran; a retried admit then holds a little more than it used,
never less, and leases give it back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from hydrant.platform.quotas.checks import (
    Admission,
    BudgetCheck,
    Check,
    ConcurrencyCheck,
    LimitUsage,
    QuotaBackendUnavailable,
    QuotaExceeded,
    Refusal,
    WindowCheck,
    WindowState,
    resolve_actuals,
    validate_checks,
)
from hydrant.platform.quotas.ingest_order import admission_alone
from hydrant.platform.quotas.redis_scripts import ADMIT, RENEW, RESYNC, SETTLE, USAGE
from hydrant.platform.quotas.script_client import LuaScript, RedisAddress, RedisScriptClient

_ADMIT, _SETTLE, _RESYNC, _RENEW, _USAGE = (
    LuaScript(s) for s in (ADMIT, SETTLE, RESYNC, RENEW, USAGE)
)

_UNAVAILABLE = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.ReadOnlyError,  # a replica during failover: retry later, like a disconnect
    OSError,
)


class RedisQuotaBackend:
    """`QuotaBackend` on Redis; `clock=None` uses the Redis server's clock (production).

    The scripts run through `scripts` (the lean pipelined client) when given, as
    `from_url` does; through redis-py's `client` otherwise.
    """

    def __init__(
        self,
        client: Redis,
        *,
        key_prefix: str = "hydrant:quota",
        clock: Callable[[], float] | None = None,
        owns_client: bool = False,
        scripts: RedisScriptClient | None = None,
    ) -> None:
        if not key_prefix or "{" in key_prefix or "}" in key_prefix:
            raise ValueError("key_prefix must be non-empty and hold no hash-tag braces")
        self._client = client
        self._prefix = key_prefix
        self._clock = clock
        self._owns_client = owns_client
        self._scripts = scripts
        self._registered = {
            script.sha: client.register_script(script.source)
            for script in (_ADMIT, _SETTLE, _RESYNC, _RENEW, _USAGE)
        }

    @classmethod
    def from_url(
        cls, url: str, *, inline_ceiling_s: float = 0.0, **kwargs: Any
    ) -> RedisQuotaBackend:
        """A backend with its own connection pool, closed by `aclose`; `inline_ceiling_s` > 0:
        its scripts are called inline while Redis answers within it (inline_redis.py).

        Short timeouts and one quick retry: a quota decision sits in front of every
        request, and redis-py's default (10 retries) would hold each one for seconds
        during an outage instead of letting the failure mode decide at once.
        """
        client = Redis.from_url(
            url,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.1), retries=1),
        )
        scripts: RedisScriptClient | None = None
        if RedisAddress.speaks(url):  # else (unix://): redis-py runs them
            scripts = RedisScriptClient(
                url, timeout_s=1.0, connect_timeout_s=1.0, inline_ceiling_s=inline_ceiling_s
            )
        return cls(client, owns_client=True, scripts=scripts, **kwargs)

    def _keys(self, check: Check) -> list[str]:
        base = f"{self._prefix}:{check.key}"
        if isinstance(check, WindowCheck):
            return [f"{base}:win", f"{base}:wt"]
        if isinstance(check, ConcurrencyCheck):
            return [f"{base}:slots"]
        return [f"{base}:bud", f"{base}:leases"]

    @staticmethod
    def _params(check: Check, amount: int) -> list[str | int | float]:
        if isinstance(check, WindowCheck):
            return ["w", check.limit, check.window_s, amount, 0, 0]
        if isinstance(check, ConcurrencyCheck):
            return ["c", check.limit, check.lease_s, 0, check.retry_after_s, 0]
        return ["b", check.limit, check.lease_s, amount, check.period_end, check.floor]

    async def _run(
        self,
        script: LuaScript,
        checks: Sequence[Check],
        rid: str,
        amounts: Sequence[int] | None = None,
        *,
        inline: bool = False,
    ) -> Any:
        keys: list[str] = []
        args: list[str | int | float] = [self._now(), rid, len(checks)]
        for index, check in enumerate(checks):
            keys.extend(self._keys(check))
            amount = amounts[index] if amounts is not None else getattr(check, "amount", 0)
            args.extend(self._params(check, amount))
        return await self._eval(script, keys, args, inline=inline)

    def _now(self) -> str:
        return "" if self._clock is None else repr(self._clock())

    async def _eval(
        self,
        script: LuaScript,
        keys: list[str],
        args: list[str | int | float],
        *,
        inline: bool = False,
    ) -> Any:
        """`inline`: the call may be made inline (quotas/inline_redis.py), where the client
        has that path. Only an admission asks: a request waits for its answer before it
        is dispatched. Settling and the rest go through the loop, where they hold up no
        other request's tokens."""
        try:
            if self._scripts is not None:
                return await self._scripts.evalsha(script, keys, args, inline=inline)
            return await self._registered[script.sha](keys=keys, args=args)
        except _UNAVAILABLE as exc:
            raise QuotaBackendUnavailable(f"Redis is unavailable: {type(exc).__name__}") from exc

    async def admit(self, checks: Sequence[Check], reservation_id: str | None = None) -> Admission:
        plan = validate_checks(checks)
        rid = reservation_id or uuid.uuid4().hex
        # Inline only while no other request is in the admission path: theirs would wait
        # (ingest_order.py); through the loop, their calls go out together.
        answer = await self._run(_ADMIT, plan, rid, inline=admission_alone())
        reply = [int(v) for v in cast(list[int], answer)]
        if reply[0] == 1:
            return Admission(reservation_id=rid, checks=plan, windows=_windows(plan, reply[1:]))
        refusals = []
        end = 2 + 2 * reply[1]
        for position in range(2, end, 2):
            check = plan[reply[position] - 1]
            retry_ms = reply[position + 1]
            retry = None if retry_ms < 0 else retry_ms / 1000
            refusals.append(Refusal(check.name, check.kind, check.limit, retry))
        raise QuotaExceeded(refusals, _windows(plan, reply[end:]))

    async def settle(self, admission: Admission, actual: Mapping[str, int] | None = None) -> None:
        amounts = resolve_actuals(admission, actual)
        if admission.settled or not admission.metered:
            admission.settled = True
            return
        resolved = [-1 if a is None else a for a in amounts]
        await self._run(_SETTLE, admission.checks, admission.reservation_id, resolved)
        admission.settled = True

    async def resync(
        self,
        admission: Admission,
        version: int,
        held: Mapping[str, int],
        spent: Mapping[str, int],
    ) -> None:
        if admission.settled or not admission.metered:
            return
        budgets = [c for c in admission.checks if isinstance(c, BudgetCheck)]
        if not budgets:
            return
        keys: list[str] = []
        args: list[str | int | float] = [self._now(), admission.reservation_id, len(budgets)]
        for check in budgets:
            keys.extend(self._keys(check))
            held_now, spent_now = int(held.get(check.name, 0)), int(spent.get(check.name, 0))
            args.extend(["b", check.lease_s, held_now, spent_now, check.period_end, version])
        await self._eval(_RESYNC, keys, args)

    async def renew(self, admission: Admission) -> bool:
        if admission.settled or not admission.metered:
            return False
        leased = [c for c in admission.checks if not isinstance(c, WindowCheck)]
        if not leased:
            return True
        lost = await self._run(_RENEW, leased, admission.reservation_id)
        return int(lost) == 0

    async def usage(self, check: Check) -> LimitUsage:
        used, reserved = await self._run(_USAGE, [check], "")
        return LimitUsage(used=int(used), reserved=int(reserved))

    async def aclose(self) -> None:
        if self._scripts is not None:
            await self._scripts.aclose()
        if self._owns_client:
            await self._client.aclose()


def _windows(plan: Sequence[Check], triples: Sequence[int]) -> tuple[WindowState, ...]:
    """The (check, total, reset_ms) triples of an ADMIT reply as window states."""
    states = []
    for position in range(0, len(triples), 3):
        check = plan[triples[position] - 1]
        remaining = max(0, check.limit - triples[position + 1])
        states.append(WindowState(check.name, check.limit, remaining, triples[position + 2] / 1000))
    return tuple(states)
