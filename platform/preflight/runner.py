"""Runs the checklist in order and collects one result per check.

Order matters: the traffic checks run first, so the capacity check judges
`max_num_seqs` against lengths the ledger has just seen, and the leak check
starts from an engine that has already served every kind of request.
A check that crashes is a FAIL carrying the error, never a silent skip.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from hydrant.platform.preflight.capacity import check_capacity
from hydrant.platform.preflight.isolation import check_context_isolation
from hydrant.platform.preflight.leak import check_kv_leak
from hydrant.platform.preflight.observability import (
    check_alert_thresholds,
    check_log_redaction,
    check_metrics_complete,
)
from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.pools import check_cold_start, check_rollback, pool_of
from hydrant.platform.preflight.report import CheckResult, Status
from hydrant.platform.preflight.session import PreflightSession
from hydrant.platform.preflight.traffic import check_batching, check_long_tail

CHECK_NAMES = (
    "dynamic batching",
    "long-tail isolation",
    "context isolation",
    "log redaction",
    "KV leak",
    "RSS flat",
    "metrics completeness",
    "alert thresholds",
    "capacity sanity",
    "cold start",
    "rollback drill",
)

Progress = Callable[[str], None]
Step = Callable[[], Awaitable[CheckResult | list[CheckResult]]]


async def run_preflight(
    url: str,
    admin_key: str,
    options: PreflightOptions,
    progress: Progress = lambda _: None,
) -> list[CheckResult]:
    session = PreflightSession(url, admin_key, metrics_token=options.metrics_token)
    try:
        progress(f"connecting to {url}, creating a throwaway tenant")
        await session.open(options.model)
        has_pools, pool = await pool_of(session)  # before any request: is the pool at zero?
        first_request_s = await session.calibrate()
        progress(f"model {session.model}: {session.tokens_per_word:g} tokens per prompt word")
        s, o = session, options
        steps: list[tuple[tuple[str, ...], Step]] = [
            (("dynamic batching",), lambda: check_batching(s, o)),
            (("long-tail isolation",), lambda: check_long_tail(s, o)),
            (("context isolation",), lambda: check_context_isolation(s, o)),
            (("log redaction",), lambda: check_log_redaction(s, o)),
            (("KV leak", "RSS flat"), lambda: check_kv_leak(s, o)),
            (("metrics completeness",), lambda: check_metrics_complete(s, o, has_pools)),
            (("alert thresholds",), lambda: check_alert_thresholds(s, o)),
            (("capacity sanity",), lambda: check_capacity(s, o)),
            (("cold start",), lambda: check_cold_start(s, o, pool, has_pools, first_request_s)),
            (("rollback drill",), lambda: check_rollback(s, o, pool, has_pools)),
        ]
        chosen = [
            (names, step)
            for names, step in steps
            if options.only is None or options.only & set(names)
        ]
        results: list[CheckResult] = []
        for number, (names, step) in enumerate(chosen, 1):
            progress(f"[{number}/{len(chosen)}] {' + '.join(names)}")
            results.extend(await _timed(names, step))
        return results
    finally:
        await session.close()


async def _timed(names: tuple[str, ...], step: Step) -> list[CheckResult]:
    started = time.perf_counter()
    try:
        outcome = await step()
    except Exception as exc:
        message = f"the check crashed: {type(exc).__name__}: {exc}"[:300]
        return [CheckResult(name, Status.FAIL, "-", "-", message) for name in names]
    results = outcome if isinstance(outcome, list) else [outcome]
    elapsed = (time.perf_counter() - started) / len(results)
    for result in results:
        result.seconds = round(elapsed, 2)
    return results
