"""Checks that only exist with worker pools: cold start within its SLA, the rollback drill.

They use the pools admin API: `GET /admin/pools` (each pool's checkpoint `path` and
its `workers` with their `state`) and `POST /admin/pools/{model}/swap` (`{"path": …}`:
start workers of that checkpoint, wait until they serve, drain the old ones).
An embedded deployment has no pools (the route answers 404): both checks are
then "not applicable" (SKIP), neither passed nor failed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession

NO_POOLS = "not applicable: no worker pools"


async def pool_of(s: PreflightSession) -> tuple[bool, dict[str, Any] | None]:
    """(the deployment has pools, this model's pool entry)."""
    status, body = await s.admin_status("/admin/pools")
    if status != 200:
        return False, None
    entries = body.get("data", body) if isinstance(body, dict) else body
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("model") == s.model:
            return True, entry
    return True, None


def _ready_workers(pool: dict[str, Any]) -> int:
    """Workers that serve now: state `ready`, not retired (being drained)."""
    workers = pool.get("workers")
    if not isinstance(workers, list):
        return 0
    return sum(
        1
        for w in workers
        if isinstance(w, dict) and w.get("state") == "ready" and not w.get("retired")
    )


async def check_cold_start(
    s: PreflightSession,
    o: PreflightOptions,
    pool: dict[str, Any] | None,
    has_pools: bool,
    first_request_s: float,
) -> CheckResult:
    """The first request preflight sent (it succeeded, or preflight stopped) woke the pool.

    `pool` is the pool as it was before that request: only a pool at zero then
    measures a cold start.
    """
    name = "cold start"
    threshold = f"first answer <= {o.cold_start_sla_s:g} s from zero"
    if not has_pools:
        return CheckResult.skip(name, threshold, NO_POOLS)
    if pool is None:
        return CheckResult.skip(name, threshold, f"no pool serves {s.model}")
    # An upstream pool too: its members asleep (HYDRANT_UPSTREAM_SLEEP) or its workload at
    # zero (the kubernetes scaler, KEDA) is a cold start like a worker pool's.
    if _ready_workers(pool) != 0:
        return CheckResult.skip(
            name, threshold, "the pool was warm (a ready worker): let it scale to zero to measure"
        )
    ok = first_request_s <= o.cold_start_sla_s
    detail = "" if ok else "waking the pool took longer than its SLA"
    # three significant digits: a CPU demo worker wakes in tens of milliseconds, which one
    # decimal would print as "0.0 s", a cold start that seems not to have been measured
    return CheckResult.judge(name, ok, threshold, f"{first_request_s:.3g} s", detail)


async def check_rollback(
    s: PreflightSession, o: PreflightOptions, pool: dict[str, Any] | None, has_pools: bool
) -> CheckResult:
    """Swap to the previous version and back with traffic flowing: zero failed requests."""
    name = "rollback drill"
    threshold = "0 failed requests across 2 swaps"
    if not has_pools:
        return CheckResult.skip(name, threshold, NO_POOLS)
    if pool is None:
        return CheckResult.skip(name, threshold, f"no pool serves {s.model}")
    if pool.get("kind", "hydrant") != "hydrant":
        why = f"not applicable: an upstream pool ({pool['kind']}) rolls out with its deployment"
        return CheckResult.skip(name, threshold, why)
    current = pool.get("path")
    previous = str(o.rollback_to) if o.rollback_to is not None else None
    if not current or previous is None:
        why = "no previous version given (--rollback-to PATH: the checkpoint to roll back to)"
        return CheckResult.skip(name, threshold, why)
    quantization = pool.get("quantization")
    statuses: list[int] = []
    done = asyncio.Event()

    async def traffic() -> None:
        """Paced requests through both swaps (the swaps' own timeouts bound it)."""
        while not done.is_set() or len(statuses) < o.rollback_requests:
            statuses.append((await s.complete("rollback drill", 2)).status)
            await asyncio.sleep(0.1)

    runner = asyncio.create_task(traffic())
    swaps = []
    try:
        for path in (previous, str(current)):  # to the previous version, then back
            answer = await s.http.post(
                f"/admin/pools/{s.model}/swap",
                json={"path": path, "quantization": quantization},
                headers={"Authorization": f"Bearer {s.admin_key}"},
                timeout=o.swap_timeout_s,
            )
            swaps.append(f"{Path(path).name}: {answer.status_code}")
    finally:
        done.set()
        await runner
    failures = sum(1 for code in statuses if code != 200)
    swap_ok = all(entry.endswith(": 200") for entry in swaps)
    measured = f"{failures}/{len(statuses)} failed; swaps {', '.join(swaps)}"
    return CheckResult.judge(name, failures == 0 and swap_ok, threshold, measured)
