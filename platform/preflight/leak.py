"""KV and memory leaks: after traffic and idle, the engine and process are back where they were.

The traffic (two rounds of the same mix) has many sizes, a shared prefix and
streams the client drops after the first chunk (aborts), the paths where a
block is most easily never freed.
Free blocks count evictable prefix-cache blocks as free (as the engine does),
so a cached prefix is not a leak; a block still referenced is.
"""

from __future__ import annotations

import asyncio

from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession, Reply

RSS = "process_resident_memory_bytes"


async def _traffic(s: PreflightSession) -> list[Reply]:
    """The round of traffic; the replies that failed."""
    shared = s.prompt_of(64, "shared prefix")
    jobs = [s.complete(s.prompt_of(16 + 24 * (i % 8), f"leak {i}"), 12) for i in range(24)]
    jobs += [s.complete(f"{shared} turn {i}", 8) for i in range(6)]
    aborts = [s.abandon_stream(s.prompt_of(32, f"abort {i}"), 64) for i in range(4)]
    replies, _ = await asyncio.gather(asyncio.gather(*jobs), asyncio.gather(*aborts))
    return [r for r in replies if not r.ok]


async def _rss(s: PreflightSession) -> float | None:
    return (await s.scrape()).value(RSS)


async def check_kv_leak(s: PreflightSession, o: PreflightOptions) -> list[CheckResult]:
    kv_name, rss_name = "KV leak", "RSS flat"
    kv_threshold = "idle free blocks = baseline"
    rss_threshold = f"growth <= {o.rss_growth:.0%}"
    before = await s.wait_idle(o.idle_timeout_s)
    if before is None or before.get("num_free_blocks") is None:
        why = "the deployment reports no engine KV state (GET /admin/engines)"
        return [CheckResult.skip(kv_name, kv_threshold, why), await _rss_only(s, o)]
    failed = await _traffic(s)
    # RSS: the first round is the warm-up (new shapes grow the allocator's pools once);
    # flat means the same round again, from idle to idle, adds nothing that stays.
    await s.wait_idle(o.idle_timeout_s)
    rss_before = await _rss(s)
    failed += await _traffic(s)
    after = await s.wait_idle(o.idle_timeout_s)
    rss_after = await _rss(s)
    if after is None:
        kv = CheckResult.judge(
            kv_name, False, kv_threshold, "-", f"not idle after {o.idle_timeout_s:g} s"
        )
    else:
        free0, free1 = int(before["num_free_blocks"]), int(after["num_free_blocks"])
        use0, use1 = float(before["kv_usage"]), float(after["kv_usage"])
        measured = f"{free1}/{after['num_total_blocks']} free (baseline {free0}), usage {use1:.3f}"
        problems = []
        if free1 < free0:
            problems.append(f"{free0 - free1} KV blocks never returned")
        if use1 > use0 + 1e-9:
            problems.append(f"KV usage {use1:.4f} above idle baseline {use0:.4f}")
        if failed:
            first = failed[0].body.get("error")
            message = first.get("message") if isinstance(first, dict) else first
            problems.append(
                f"{len(failed)} traffic requests failed (first: {failed[0].status} {message})"
            )
        kv = CheckResult.judge(kv_name, not problems, kv_threshold, measured, "; ".join(problems))
    return [kv, _judge_rss(rss_name, rss_threshold, rss_before, rss_after, o)]


async def _rss_only(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    value = await _rss(s)
    if value is None:
        return CheckResult.skip("RSS flat", f"growth <= {o.rss_growth:.0%}", f"{RSS} not exported")
    return CheckResult.skip("RSS flat", f"growth <= {o.rss_growth:.0%}", "no traffic was run")


def _judge_rss(
    name: str, threshold: str, before: float | None, after: float | None, o: PreflightOptions
) -> CheckResult:
    if before is None or after is None or before <= 0:
        return CheckResult.skip(name, threshold, f"{RSS} is not exported by /metrics")
    growth = (after - before) / before
    measured = f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB ({growth:+.1%})"
    detail = "" if growth <= o.rss_growth else "memory grew over one round of traffic"
    return CheckResult.judge(name, growth <= o.rss_growth, threshold, measured, detail)
