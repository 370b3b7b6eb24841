"""What a front adds to a request, from two `vllm bench serve` runs made at the same time:
one straight to vLLM, one through the front (bench/upstream.py `--paired`).

Sequential runs on this host differ by more than the targets are about (vLLM's own TPOT
moved by a third between rounds of the same server), so the difference between a direct
run and a front's run is mostly what the host did meanwhile. Run at once, both arms share
vLLM's batches and the host's moments. Better still, each request through the front is
matched with the direct request sent closest in time: the two spend nearly all their lives
in the same batches, so the ratio of their TPOTs is what the front adds to that request
(a do-nothing relay measures 1.000 with quartiles within about 1.5 %, where the arms'
medians still differ by ±5 %). `vllm bench serve` saves each request's send time
(`perf_counter`: on Linux one monotonic clock for every process), first-token time,
latency, gaps and token count with `--save-detailed`; everything here reads those.

Pure functions over the clients' saved results; no I/O.
"""

from __future__ import annotations

import bisect
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy


@dataclass(frozen=True)
class Sent:
    """One finished request of a client's run (ms)."""

    at: float  # its send time, seconds on the clients' shared clock
    ttft: float
    tpot: float  # after its first token, per other token (as `vllm bench serve` counts)


def finished(data: dict[str, Any]) -> list[Sent]:
    """The requests of a client's detailed result that ended with two or more tokens, in
    the order they were sent (a failed request, or one token, has no TPOT)."""
    out = []
    for i, at in enumerate(data["start_times"]):
        tokens = data["output_lens"][i]
        if data["errors"][i] or tokens < 2:
            continue
        ttft, latency = data["ttfts"][i], data["latencies"][i]
        out.append(Sent(at, 1e3 * ttft, 1e3 * (latency - ttft) / (tokens - 1)))
    return sorted(out, key=lambda sent: sent.at)


def overlap(arms: list[dict[str, Any]]) -> tuple[float, float]:
    """The span of send times in which every arm was sending: each client starts and ends
    on its own, and at the edges one arm runs alone, on a vLLM the other does not share."""
    return max(min(a["start_times"]) for a in arms), min(max(a["start_times"]) for a in arms)


def figures_between(data: dict[str, Any], start: float, end: float) -> dict[str, float]:
    """A client's figures (ms; `requests`: how many) over the requests it sent from
    `start` to `end`, computed as `vllm bench serve` computes them over a whole run (TPOT
    per request, ITL over every gap, numpy's linear percentiles)."""
    ttfts: list[float] = []
    tpots: list[float] = []
    e2es: list[float] = []
    itls: list[float] = []
    for i, at in enumerate(data["start_times"]):
        tokens = data["output_lens"][i]
        if not start <= at <= end or data["errors"][i] or not tokens:
            continue
        ttfts.append(1e3 * data["ttfts"][i])
        e2es.append(1e3 * data["latencies"][i])
        if tokens > 1:
            tpots.append(1e3 * (data["latencies"][i] - data["ttfts"][i]) / (tokens - 1))
        itls.extend(1e3 * gap for gap in data["itls"][i])

    def pct(values: list[float], q: float) -> float:
        return float(numpy.percentile(values, q)) if values else math.nan

    return {
        "ttft_p50": pct(ttfts, 50),
        "ttft_p99": pct(ttfts, 99),
        "tpot_p50": pct(tpots, 50),
        "itl_p99": pct(itls, 99),
        "e2e_p50": pct(e2es, 50),
        "requests": float(len(ttfts)),
    }


@dataclass(frozen=True)
class Match:
    """A request through the front against its direct twin."""

    ttft_added: float  # ms
    tpot_ratio: float
    apart: float  # seconds between their sends


def matched(direct: list[Sent], through: list[Sent], start: float, end: float) -> list[Match]:
    """Each request sent through the front within [`start`, `end`], with the direct
    request sent closest to it in time (`direct` in send order; a direct request may be
    the nearest of two)."""
    if not direct:
        return []
    times = [sent.at for sent in direct]
    out = []
    for sent in through:
        if not start <= sent.at <= end:
            continue
        k = bisect.bisect_left(times, sent.at)
        near = min(
            (j for j in (k - 1, k) if 0 <= j < len(direct)), key=lambda j: abs(times[j] - sent.at)
        )
        twin = direct[near]
        out.append(Match(sent.ttft - twin.ttft, sent.tpot / twin.tpot, abs(sent.at - twin.at)))
    return out


@dataclass
class Pair:
    """One paired run of a front at one rate: each arm's figures over the overlap, and the
    matched requests."""

    rate: str  # both arms' rate together
    front: str
    direct: dict[str, float]
    through: dict[str, float]
    matches: list[Match]
    failed: int
    other_cores: float
    cpu_ms_per_k: float  # the front's CPU per 1,000 of its arm's output tokens
    front_ms: float | None = None  # Hydrant's own time outside vLLM, mean
    admission_ms: float | None = None  # Hydrant's wait for its quota store's admission, mean
    ttfts: dict[str, list[float]] = field(default_factory=dict)  # arm -> over the overlap, ms


def pair_of(
    rate: str, front: str, direct: dict[str, Any], through: dict[str, Any], **rest: Any
) -> Pair:
    """A `Pair` from the two clients' detailed results (`rest`: Pair's other fields)."""
    start, end = overlap([direct, through])
    sent = {"direct": finished(direct), "through": finished(through)}
    return Pair(
        rate=rate,
        front=front,
        direct=figures_between(direct, start, end),
        through=figures_between(through, start, end),
        matches=matched(sent["direct"], sent["through"], start, end),
        ttfts={arm: [s.ttft for s in sents if start <= s.at <= end] for arm, sents in sent.items()},
        **rest,
    )


def _median(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if not values:
        return math.nan, math.nan, math.nan
    q1, q2, q3 = numpy.percentile(values, [25, 50, 75])
    return float(q1), float(q2), float(q3)


def paired_table(pairs: list[Pair], labels: dict[str, str], order: tuple[str, ...]) -> str:
    """At each rate, a row per front: each arm's figures (medians over the rounds), what
    the front adds in matched requests (pooled over the rounds: the median and quartiles
    of each request's TTFT difference and TPOT ratio to its direct twin), the difference
    of the arms' TTFT p99 over every round's requests (one round's p99 is its slowest
    request or two), and the front's CPU, own time and wait for its quota admission."""
    lines = [
        "| rate (both arms) | front | TTFT p50 / p99 ms, direct | through"
        " | TTFT added, matched: median (quartiles) ms | TTFT p99 added ms, pooled"
        " | TPOT p50 ms, direct | through | TPOT ratio, matched: median (quartiles)"
        " | ITL p99 ratio | front CPU ms per 1,000 tokens | front's own ms"
        " | quota admission, mean ms | matched requests (rounds) | failed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in dict.fromkeys(p.rate for p in pairs):
        for kind in order:
            cells = [p for p in pairs if p.rate == rate and p.front == kind]
            if not cells:
                continue

            def arm(side: str, key: str, cells: list[Pair] = cells) -> float:
                return _median([getattr(c, side)[key] for c in cells])

            def p99(side: str, cells: list[Pair] = cells) -> float:
                pooled = [t for c in cells for t in c.ttfts.get(side, ())]
                return float(numpy.percentile(pooled, 99)) if pooled else math.nan

            matches = [m for c in cells for m in c.matches]
            t1, t2, t3 = _quartiles([m.ttft_added for m in matches])
            r1, r2, r3 = _quartiles([m.tpot_ratio for m in matches])
            itl = _median([c.through["itl_p99"] / c.direct["itl_p99"] for c in cells])
            own = _median([c.front_ms for c in cells if c.front_ms is not None])
            admission = _median([c.admission_ms for c in cells if c.admission_ms is not None])
            lines.append(
                f"| {rate}/s | {labels[kind]}"
                f" | {arm('direct', 'ttft_p50'):.1f} / {arm('direct', 'ttft_p99'):.1f}"
                f" | {arm('through', 'ttft_p50'):.1f} / {arm('through', 'ttft_p99'):.1f}"
                f" | {t2:+.1f} ({t1:+.1f} to {t3:+.1f}) | {p99('through') - p99('direct'):+.1f}"
                f" | {arm('direct', 'tpot_p50'):.2f} | {arm('through', 'tpot_p50'):.2f}"
                f" | {r2:.3f}x ({r1:.3f} to {r3:.3f}) | {itl:.2f}x"
                f" | {_median([c.cpu_ms_per_k for c in cells]):,.0f}"
                f" | {'-' if math.isnan(own) else f'{own:.2f}'}"
                f" | {'-' if math.isnan(admission) else f'{admission:.2f}'}"
                f" | {len(matches)} ({len(cells)}) | {sum(c.failed for c in cells)} |"
            )
    return "\n".join(lines)
