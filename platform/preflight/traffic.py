"""Checks under load: dynamic batching, and short requests isolated from long prompts."""

from __future__ import annotations

import asyncio
import math

from hydrant.platform.preflight.metrics_text import histogram_mean
from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession, Reply

BATCH_METRIC = "hydrant_batch_tokens_per_step"


def p99(values: list[float]) -> float:
    """Nearest-rank p99 (the max for fewer than 100 values): no interpolation to flatter it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(0.99 * len(ordered)) - 1, 0)]


def _failures(replies: list[Reply]) -> str:
    bad = [r for r in replies if not r.ok]
    if not bad:
        return ""
    first = bad[0].body.get("error", {})
    message = first.get("message") if isinstance(first, dict) else first
    return f"{len(bad)} of {len(replies)} requests failed (first: {bad[0].status} {message})"


async def check_batching(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    """Mean tokens per engine step during a burst, against a lone request's."""
    name = "dynamic batching"
    threshold = f">= {o.batch_factor:g}x solo tokens/step"
    before = await s.scrape()
    if not before.has(BATCH_METRIC):
        return CheckResult.judge(name, False, threshold, "-", f"{BATCH_METRIC} is not exported")
    solo = [await s.complete(s.prompt_of(8, f"solo {i}"), max_tokens=16) for i in range(3)]
    middle = await s.scrape()
    solo_mean, solo_steps = histogram_mean(before, middle, BATCH_METRIC, model=s.model)
    burst = await asyncio.gather(
        *(s.complete(s.prompt_of(8, f"burst {i}"), max_tokens=16) for i in range(o.batch_requests))
    )
    after = await s.scrape()
    burst_mean, burst_steps = histogram_mean(middle, after, BATCH_METRIC, model=s.model)
    failures = _failures([*solo, *burst])
    if failures:
        return CheckResult.judge(name, False, threshold, "-", failures)
    if solo_steps == 0 or burst_steps == 0:
        return CheckResult.judge(
            name, False, threshold, "-", f"no engine steps recorded for model {s.model}"
        )
    ratio = burst_mean / solo_mean
    measured = f"{ratio:.1f}x ({burst_mean:.1f} vs {solo_mean:.1f} tokens/step)"
    detail = "" if ratio >= o.batch_factor else "requests run one by one: batching is off"
    return CheckResult.judge(name, ratio >= o.batch_factor, threshold, measured, detail)


async def check_long_tail(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    """Short requests one after another, alone and then with 10% long prompts in flight."""
    name = "long-tail isolation"
    short = o.short_prompt_tokens
    solo = [await s.complete(s.prompt_of(short, f"short solo {i}"), 8) for i in range(10)]
    long_tasks: list[asyncio.Task[Reply]] = []
    mixed: list[Reply] = []
    for i in range(20):
        if i % 10 == 0:  # 2 long of 20 short + 2 long: ~10% of the traffic
            prompt = s.prompt_of(o.long_prompt_tokens, f"long {i}")
            long_tasks.append(asyncio.create_task(s.complete(prompt, 8)))
            await asyncio.sleep(0.05)  # let the long prompt reach the engine first
        mixed.append(await s.complete(s.prompt_of(short, f"short mixed {i}"), 8))
    longs = list(await asyncio.gather(*long_tasks))
    solo_p99 = p99([r.seconds for r in solo])
    bound = max(o.tail_factor * solo_p99, solo_p99 + o.tail_slack_s)
    threshold = f"p99 <= max({o.tail_factor:g}x solo, solo+{o.tail_slack_s:g}s)"
    failures = _failures([*solo, *mixed, *longs])
    if failures:
        return CheckResult.judge(name, False, threshold, "-", failures)
    mixed_p99 = p99([r.seconds for r in mixed])
    measured = f"{mixed_p99 * 1000:.0f} ms vs solo {solo_p99 * 1000:.0f} ms"
    detail = "" if mixed_p99 <= bound else "long prompts stall short ones (check the lanes)"
    return CheckResult.judge(name, mixed_p99 <= bound, threshold, measured, detail)
