"""Batch interference: interactive short requests at a fixed rate, alone and beside a batch.

What it shows, against the targets of issue #27: interactive p50/p99 time to first
token and latency alone and while a 2,000-line Batch API batch runs on the same
gateway and engine (same run), and the batch's lines per second. Targets: interactive
p99 latency within 20 % of alone, and the batch using at least half of the capacity the
interactive traffic leaves idle.

How "idle capacity" is measured: the batch is first run alone (a shorter one) for its
lines per second on an otherwise idle engine (`alone`); the interactive phase measures
the share of time at least one interactive request was in flight (`busy`); the idle
capacity is `alone x (1 - busy)` lines per second, and the batch's rate during the
mixed phase is compared with it.

The gateway is `hydrant serve` on the embedded default (SQLite, the demo model on the
CPU, the batch jobs on its own loop) in a temporary folder; interactive requests are
streamed (`stream: true`, for the time to their first token) at a fixed rate, open loop.

Usage: python bench/batch_interference.py [--quick] [--rate R] [--seconds S] [--lines N]
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


async def batch_alone(client: httpx.AsyncClient, lines: int) -> float:
    """Lines per second of a batch with the engine to itself (from its first line done)."""
    batch_id = await start_batch(client, lines, "alone")
    while await completed(client, batch_id) == 0:
        await asyncio.sleep(0.05)
    began, first = time.monotonic(), await completed(client, batch_id)
    while (state := await batch_state(client, batch_id))["status"] not in ("completed", "failed"):
        await asyncio.sleep(0.1)
    return (state["request_counts"]["completed"] - first) / (time.monotonic() - began)


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


async def run(args: argparse.Namespace, url: str, admin_key: str) -> None:
    key = tenant(url, admin_key, f"bench-{int(time.time())}")
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        await interactive(client, args.rate, 3)  # warm-up: the engine, the caches
        alone_rate = await batch_alone(client, args.alone_lines)
        began = time.monotonic()
        alone = await interactive(client, args.rate, args.seconds)
        busy = alone.busy_share(began, time.monotonic())

        batch_id = await start_batch(client, args.lines, "mixed")
        while await completed(client, batch_id) == 0:
            await asyncio.sleep(0.05)
        before, began = await completed(client, batch_id), time.monotonic()
        mixed = await interactive(client, args.rate, args.seconds)
        during = (await completed(client, batch_id) - before) / (time.monotonic() - began)
        await client.post(f"/v1/batches/{batch_id}/cancel")

    idle = alone_rate * (1 - busy)
    p99_alone, p99_mixed = pct(alone.latency(), 0.99), pct(mixed.latency(), 0.99)
    print(
        f"\nrate {args.rate:g} req/s for {args.seconds:g} s per phase; interactive: "
        f"{INTERACTIVE_WORDS} words in, {INTERACTIVE_TOKENS} tokens out (streamed); batch "
        f"lines: {BATCH_WORDS} words in, {BATCH_TOKENS} tokens out; a {args.lines}-line batch"
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
    parser.add_argument("--lines", type=int, default=2000, help="lines of the mixed batch")
    parser.add_argument("--alone-lines", type=int, default=None, help="lines of the solo batch")
    parser.add_argument("--env", action="append", default=[], metavar="HYDRANT_X=V")
    args = parser.parse_args()
    args.seconds = args.seconds or (20.0 if args.quick else 60.0)
    args.alone_lines = args.alone_lines or (150 if args.quick else 400)
    extra = dict(item.split("=", 1) for item in args.env)
    with tempfile.TemporaryDirectory(prefix="hydrant-batch-bench-") as folder:
        gateway = Gateway(Path(folder), extra_env=extra)
        try:
            asyncio.run(run(args, gateway.url, gateway.admin_key))
        finally:
            gateway.stop()


if __name__ == "__main__":
    main()
