"""Batch interference: interactive short requests at a fixed rate, alone and beside a batch.

What it shows, against the targets of issue #27: interactive p50/p99 time to first
token and latency alone and while a 2,000-line Batch API batch runs on the same
gateway and engine (same run), and the batch's lines per second. Targets: interactive
p99 latency within 20 % of alone, and the batch using at least half of the capacity the
interactive traffic leaves idle.

The run is a few rounds, each: interactive requests alone for a window; then a fresh
2,000-line batch, and the same interactive load beside it for a window; then the batch
alone for a shorter window (its lines per second with the engine to itself); then the
batch is cancelled. Rounds interleave the two conditions, so a neighbour's load on a
shared host lands on both alike; the samples of all rounds are pooled per condition.

How "idle capacity" is measured: the batch alone's lines per second (`alone`), times
the share of the interactive-alone windows with no interactive request in flight
(`1 - busy`); the batch's rate beside the interactive load is compared with it.

The gateway is `hydrant serve` on the embedded default (SQLite, the demo model on the
CPU, the batch jobs on its own loop) in a temporary folder; interactive requests are
streamed (`stream: true`, for the time to their first token) at a fixed rate, open loop.

Usage: python bench/batch_interference.py [--quick] [--rate R] [--seconds S] [--lines N]
       [--rounds N] [--env HYDRANT_X=V]...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from soak import Gateway, pct

INTERACTIVE_WORDS, INTERACTIVE_TOKENS = 12, 16
BATCH_WORDS, BATCH_TOKENS = 24, 32


@dataclass
class Phase:
    """The interactive requests of one phase: (start, first token, end) per request."""

    calls: list[tuple[float, float, float]] = field(default_factory=list)
    errors: int = 0

    def ttft(self) -> list[float]:
        return [first - start for start, first, _ in self.calls]

    def latency(self) -> list[float]:
        return [end - start for start, _, end in self.calls]

    def busy_share(self, began: float, ended: float) -> float:
        """The share of [began, ended) with at least one request in flight."""
        covered, reach = 0.0, began
        for start, _, end in sorted(self.calls):
            start, end = max(start, reach), min(end, ended)
            if end > start:
                covered += end - start
                reach = end
        return covered / (ended - began)


def batch_file(lines: int, tag: str) -> bytes:
    out = []
    for i in range(lines):
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": f"{tag} {i}" + " lorem" * BATCH_WORDS}],
            "max_tokens": BATCH_TOKENS,
            "temperature": 0,
            "ignore_eos": True,  # every line does the same work
        }
        line = {"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions"}
        out.append(json.dumps({**line, "body": body}))
    return ("\n".join(out) + "\n").encode()


def tenant(url: str, admin_key: str, name: str) -> str:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}) as c:
        made = c.post("/admin/tenants", json={"name": name}).raise_for_status().json()
        key = c.post("/admin/keys", json={"tenant_id": made["id"]}).raise_for_status()
        return str(key.json()["secret"])


async def start_batch(client: httpx.AsyncClient, lines: int, tag: str) -> str:
    upload = await client.post(
        "/v1/files",
        files={"file": (f"{tag}.jsonl", batch_file(lines, tag), "application/jsonl")},
        data={"purpose": "batch"},
    )
    upload.raise_for_status()
    body = {
        "input_file_id": upload.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    batch = (await client.post("/v1/batches", json=body)).raise_for_status().json()
    assert batch["status"] == "in_progress", batch
    return str(batch["id"])


async def batch_state(client: httpx.AsyncClient, batch_id: str) -> dict[str, Any]:
    return dict((await client.get(f"/v1/batches/{batch_id}")).raise_for_status().json())


async def completed(client: httpx.AsyncClient, batch_id: str) -> int:
    return int((await batch_state(client, batch_id))["request_counts"]["completed"])


async def wait_for(
    client: httpx.AsyncClient, batch_id: str, done: int, statuses: tuple[str, ...] = ()
) -> None:
    """Until the batch has `done` lines completed (or is in one of `statuses`)."""
    while True:
        state = await batch_state(client, batch_id)
        if state["request_counts"]["completed"] >= done or state["status"] in statuses:
            return
        await asyncio.sleep(0.05)


async def one_request(client: httpx.AsyncClient, n: int, phase: Phase) -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": f"q{n}" + " hello" * INTERACTIVE_WORDS}],
        "max_tokens": INTERACTIVE_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    start = time.monotonic()
    first = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                phase.errors += 1
                return
            async for text in response.aiter_lines():
                if first is None and '"content":"' in text.replace(" ", ""):
                    first = time.monotonic()
    except httpx.HTTPError:
        phase.errors += 1
        return
    end = time.monotonic()
    phase.calls.append((start, first or end, end))


async def interactive(client: httpx.AsyncClient, rate: float, seconds: float) -> Phase:
    """Requests at a fixed rate (open loop: one starts every 1/rate s, whatever runs)."""
    phase = Phase()
    tasks = []
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < seconds:
        tasks.append(asyncio.create_task(one_request(client, n, phase)))
        n += 1
        await asyncio.sleep(max(0.0, began + n / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    return phase


def row(name: str, phase: Phase) -> str:
    ttft, latency = phase.ttft(), phase.latency()
    cells = [pct(ttft, 0.5), pct(ttft, 0.99), pct(latency, 0.5), pct(latency, 0.99)]
    ms = " | ".join(f"{1000 * value:.0f}" for value in cells)
    return f"| {name} | {len(phase.calls)} | {phase.errors} | {ms} |"


@dataclass
class Totals:
    """What the rounds measured, pooled per condition."""

    alone: Phase = field(default_factory=Phase)
    mixed: Phase = field(default_factory=Phase)
    busy_seconds: float = 0.0
    alone_seconds: float = 0.0
    lines_mixed: int = 0
    seconds_mixed: float = 0.0
    lines_alone: int = 0
    seconds_alone: float = 0.0

    def add(self, into: Phase, phase: Phase) -> None:
        into.calls.extend(phase.calls)
        into.errors += phase.errors


async def round_of(client: httpx.AsyncClient, args: argparse.Namespace, n: int, t: Totals) -> None:
    began = time.monotonic()
    alone = await interactive(client, args.rate, args.seconds)
    ended = time.monotonic()
    t.add(t.alone, alone)
    t.busy_seconds += alone.busy_share(began, ended) * (ended - began)
    t.alone_seconds += ended - began

    batch_id = await start_batch(client, args.lines, f"round{n}")
    await wait_for(client, batch_id, 1)  # running: its first line is done
    before, began = await completed(client, batch_id), time.monotonic()
    mixed = await interactive(client, args.rate, args.seconds)
    t.add(t.mixed, mixed)
    t.lines_mixed += await completed(client, batch_id) - before
    t.seconds_mixed += time.monotonic() - began

    before, began = await completed(client, batch_id), time.monotonic()
    await asyncio.sleep(args.seconds / 2)  # the batch with the engine to itself
    t.lines_alone += await completed(client, batch_id) - before
    t.seconds_alone += time.monotonic() - began
    await client.post(f"/v1/batches/{batch_id}/cancel")
    await wait_for(client, batch_id, 10**9, ("cancelled", "completed"))


async def run(args: argparse.Namespace, url: str, admin_key: str) -> None:
    key = tenant(url, admin_key, f"bench-{int(time.time())}")
    headers = {"Authorization": f"Bearer {key}"}
    totals = Totals()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        await interactive(client, args.rate, 3)  # warm-up: the engine, the caches
        for n in range(args.rounds):
            await round_of(client, args, n, totals)

    alone, mixed = totals.alone, totals.mixed
    busy = totals.busy_seconds / totals.alone_seconds
    alone_rate = totals.lines_alone / totals.seconds_alone
    during = totals.lines_mixed / totals.seconds_mixed
    idle = alone_rate * (1 - busy)
    p99_alone, p99_mixed = pct(alone.latency(), 0.99), pct(mixed.latency(), 0.99)
    print(
        f"\n{args.rounds} rounds of {args.seconds:g} s per condition; {args.rate:g} interactive "
        f"req/s, {INTERACTIVE_WORDS} words in, {INTERACTIVE_TOKENS} tokens out (streamed); a "
        f"{args.lines}-line batch per round, lines of {BATCH_WORDS} words in, "
        f"{BATCH_TOKENS} tokens out"
    )
    print("\n| interactive | requests | errors | TTFT p50 ms | TTFT p99 ms | latency p50 ms "
          "| latency p99 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print(row("alone", alone))
    print(row("with the batch", mixed))
    print("\n| batch | lines/s |")
    print("|---|---|")
    print(f"| alone (engine to itself) | {alone_rate:.1f} |")
    print(f"| idle capacity: alone x (1 - busy {busy:.2f}) | {idle:.1f} |")
    print(f"| while the interactive load runs | {during:.1f} |")
    latency_ok = p99_mixed <= 1.2 * p99_alone
    share_ok = during >= 0.5 * idle
    print(
        f"\ninteractive p99 latency {1000 * p99_mixed:.0f} ms vs {1000 * p99_alone:.0f} ms alone "
        f"({p99_mixed / p99_alone:.2f}x; target <= 1.20x): {'met' if latency_ok else 'MISSED'}"
    )
    print(
        f"batch {during:.1f} lines/s = {during / idle if idle else 0:.2f} of the idle capacity "
        f"(target >= 0.50): {'met' if share_ok else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (CI, shared hosts)")
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests per s")
    parser.add_argument("--seconds", type=float, default=None, help="each phase's length")
    parser.add_argument("--lines", type=int, default=2000, help="lines of each round's batch")
    parser.add_argument("--rounds", type=int, default=None, help="alone/mixed rounds")
    parser.add_argument("--env", action="append", default=[], metavar="HYDRANT_X=V")
    args = parser.parse_args()
    args.seconds = args.seconds or (10.0 if args.quick else 30.0)
    args.rounds = args.rounds or (3 if args.quick else 4)
    extra = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="hydrant-batch-bench-") as folder:
        gateway = Gateway(Path(folder), extra_env=extra)
        try:
            asyncio.run(run(args, gateway.url, gateway.admin_key))
        finally:
            gateway.stop()


if __name__ == "__main__":
    main()
