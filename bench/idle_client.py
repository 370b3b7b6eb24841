"""One streamed request at a time to each arm in turn: what each front adds to an idle TTFT.

    <peers>/bin/python bench/idle_client.py CONFIG.json

Run by bench/upstream.py `--idle` in the peers' environment (aiohttp, the HTTP client
`vllm bench serve` uses). CONFIG holds the arms (name, base URL, key or null, and the
model), the number of cycles and where to write the result. Each cycle draws a prompt
(words, so every front tokenizes text as vLLM does when reached directly) and sends it to
every arm once, in an order drawn per cycle, one after the other: with nothing else in
flight, vLLM starts each request at once, so an arm's TTFT minus the direct arm's in the
same cycle is what its front added to that request. TTFT is the time from sending the
request to the first body bytes holding an event, as `vllm bench serve` takes it.
The result holds each arm's TTFTs (ms, warm-up left out) and how many requests each arm
was sent, warm-up included.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

import aiohttp

WORDS = ("alpha", "river", "stone", "light", "paper", "north", "glass", "ember", "cloud")
PAUSE_S = 0.06  # between cycles: under the default plan's per-key rate for this size
WARMUP = 20


async def _ttft(session: aiohttp.ClientSession, arm: dict[str, Any], prompt: str) -> float:
    headers = {"Authorization": f"Bearer {arm['key']}"} if arm.get("key") else {}
    body = {
        "model": arm["model"],
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    async with session.post(f"{arm['base']}/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise SystemExit(f"{arm['name']}: HTTP {r.status}: {(await r.text())[:300]}")
        async for data in r.content.iter_any():
            if first is None and b"data:" in data:
                first = time.perf_counter()
    if first is None:
        raise SystemExit(f"{arm['name']}: the stream held no event")
    return 1e3 * (first - started)


async def main(config_path: str) -> None:
    with open(config_path) as f:
        config = json.load(f)
    arms: list[dict[str, Any]] = config["arms"]
    cycles: int = config["cycles"]
    rng = random.Random(config.get("seed", 0))
    ttft: dict[str, list[float]] = {arm["name"]: [] for arm in arms}
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for cycle in range(WARMUP + cycles):
            prompt = " ".join(rng.choice(WORDS) for _ in range(config.get("words", 120)))
            order = arms[:]
            rng.shuffle(order)
            await asyncio.sleep(PAUSE_S)
            for arm in order:
                took = await _ttft(session, arm, prompt)
                if cycle >= WARMUP:
                    ttft[arm["name"]].append(took)
            done = cycle + 1 - WARMUP
            if done > 0 and done % 50 == 0:
                print(f"  {done} of {cycles} cycles", file=sys.stderr, flush=True)
    with open(config["out"], "w") as f:
        json.dump({"ttft": ttft, "requests": WARMUP + cycles}, f)  # requests: per arm


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
