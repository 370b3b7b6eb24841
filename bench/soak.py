"""Soak: 10 tenants on mixed plans and request sizes against one gateway, for minutes.

What it shows at the end, against the targets of issue #8: the error rate
(5xx and dropped connections; 429 refusals are counted apart, they are the
plans working), p50/p99 latency, KV usage, RSS over time and its growth after
warm-up (target < 5%), and ledger exactness: every request that got a 200 has
exactly one ledger row (0 lost, 0 double counted).

The gateway is started here (the embedded default: SQLite, in-memory limits,
the demo model, in a temporary folder) unless `--url` points at a running one;
then `--admin-key` is needed, and `--database-url` for the ledger comparison.

Usage: python bench/soak.py [--quick] [--duration S] [--url URL --admin-key K
       [--database-url URL]]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

TENANTS = 10
# Plans of the tenants, in turn: a limited free plan, a pro plan, and no plan at all.
PLANS: dict[str, dict[str, Any]] = {
    "free": {"requests_per_minute": 90, "tokens_per_minute": 60_000},
    "pro": {"requests_per_minute": 1200, "max_concurrent_requests": 4},
}
TENANT_PLANS = ["free", "pro", None, "free", "pro", None, "free", "pro", None, None]
# Request sizes in prompt words and max_tokens: mostly short (< 512 tokens, free-flowing),
# every fourth one in the 512-2048 tier (at most 10 requests/s per key).
SHORT = (12, 16)
MEDIUM = (220, 24)


@dataclass
class Sample:
    t: float
    kv: float | None
    rss: float | None


@dataclass
class Results:
    calls: list[tuple[str, int, float, str | None]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    def statuses(self) -> Counter[int]:
        return Counter(status for _, status, _, _ in self.calls)


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Gateway:
    """`hydrant serve` on the embedded default in a temporary folder."""

    def __init__(self, base: Path, extra_env: dict[str, str] | None = None) -> None:
        from hydrant.engine.demo_model import write_demo_model
        from hydrant.platform.keys import generate_key

        self.base = base
        self.admin_key = generate_key("test").secret
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        model = write_demo_model(base / "model")
        self.database_url = f"sqlite+aiosqlite:///{base / 'data' / 'hydrant.db'}"
        env = {
            **os.environ,
            "HYDRANT_DATA_DIR": str(base / "data"),
            "HYDRANT_PORT": str(self.port),
            "HYDRANT_MODELS": f"demo={model}",
            "HYDRANT_ADMIN_BOOTSTRAP_KEY": self.admin_key,
            "HYDRANT_LOG_FILE": str(base / "server.log"),
            "HYDRANT_KV_CACHE_BYTES": str(64 * 2**20),
            "HYDRANT_MAX_NUM_SEQS": "24",
            **(extra_env or {}),
        }
        self.stderr = open(base / "server.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hydrant.cli", "serve"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        deadline = time.monotonic() + 180
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"hydrant serve exited: see {base / 'server.stderr'}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("hydrant serve did not become ready in 180 s")
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.stderr.close()


def create_tenants(url: str, admin_key: str) -> list[tuple[str, str, str]]:
    """(tenant id, key, plan name) for each tenant, created through the admin API."""
    tag = secrets.token_hex(3)
    out = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}) as c:
        plan_ids = {
            name: c.post("/admin/plans", json={"name": f"soak-{name}-{tag}", **limits})
            .raise_for_status()
            .json()["id"]
            for name, limits in PLANS.items()
        }
        for i, plan in enumerate(TENANT_PLANS[:TENANTS]):
            body: dict[str, Any] = {"name": f"soak-{tag}-{i}"}
            if plan is not None:
                body["plan"] = plan_ids[plan]
            tenant = c.post("/admin/tenants", json=body).raise_for_status().json()
            key = c.post("/admin/keys", json={"tenant_id": tenant["id"]}).raise_for_status()
            out.append((str(tenant["id"]), str(key.json()["secret"]), plan or "none"))
    return out


async def tenant_loop(
    client: httpx.AsyncClient, tenant: str, key: str, stop_at: float, results: Results
) -> None:
    n = 0
    while time.monotonic() < stop_at:
        words, max_tokens = MEDIUM if n % 4 == 3 else SHORT
        n += 1
        body = {
            "model": "demo",
            "messages": [{"role": "user", "content": f"{tenant} {n}" + " lorem" * words}],
            "max_tokens": max_tokens,
        }
        started = time.perf_counter()
        try:
            response = await client.post(
                "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            status, rid = response.status_code, response.headers.get("x-request-id")
        except httpx.HTTPError:
            status, rid = 0, None
        results.calls.append((tenant, status, time.perf_counter() - started, rid))
        if status == 429:
            await asyncio.sleep(float(response.headers.get("retry-after", "1")) / 4)
        await asyncio.sleep(0.02)


def scrape(text: str) -> tuple[float | None, float | None]:
    kv = rss = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hydrant_kv_cache_usage_perc":
                kv = max(kv or 0.0, float(sample.value))
            elif sample.name == "process_resident_memory_bytes":
                rss = float(sample.value)
    return kv, rss


async def sampler(
    client: httpx.AsyncClient, started: float, stop_at: float, results: Results, every: float
) -> None:
    while True:
        try:
            kv, rss = scrape((await client.get("/metrics")).text)
        except httpx.HTTPError:
            kv = rss = None
        now = time.monotonic()
        results.samples.append(Sample(now - started, kv, rss))
        codes = results.statuses()
        errors = sum(v for k, v in codes.items() if k == 0 or k >= 500)
        lat = [s for _, st, s, _ in results.calls if st == 200]
        print(
            f"  t={now - started:6.1f}s requests={len(results.calls):6d} errors={errors}"
            f" p50={pct(lat, 0.5) * 1000:6.0f}ms kv={kv if kv is not None else float('nan'):.3f}"
            f" rss={(rss or 0) / 2**20:7.1f}MiB",
            flush=True,
        )
        if now >= stop_at:
            return
        await asyncio.sleep(min(every, max(stop_at - now, 0.1)))


async def run_load(
    url: str, tenants: list[tuple[str, str, str]], duration: float, every: float
) -> Results:
    results = Results()
    limits = httpx.Limits(max_connections=64, keepalive_expiry=1.0)  # < uvicorn's 5 s
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        started = time.monotonic()
        stop_at = started + duration
        await asyncio.gather(
            sampler(client, started, stop_at, results, every),
            *(tenant_loop(client, tid, key, stop_at, results) for tid, key, _ in tenants),
        )
    return results


async def ledger_counts(database_url: str, tenant_ids: list[str]) -> Counter[str]:
    """How many ledger rows each request id has (of these tenants)."""
    from sqlalchemy import select

    from hydrant.platform.db.models import LedgerEntry
    from hydrant.platform.db.session import Database

    database = Database(database_url)
    try:
        async with database.session() as session:
            rows = await session.execute(
                select(LedgerEntry.request_id).where(LedgerEntry.tenant_id.in_(tenant_ids))
            )
            return Counter(str(r) for (r,) in rows.all())
    finally:
        await database.dispose()


async def settled_ledger(
    database_url: str, tenant_ids: list[str], served: set[str], timeout_s: float = 60
) -> Counter[str]:
    """Ledger rows once every 200 has one, or after `timeout_s` (spooled entries replay)."""
    deadline = time.monotonic() + timeout_s
    while True:
        counts = await ledger_counts(database_url, tenant_ids)
        if served <= set(counts) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(1)


def report(
    results: Results,
    duration: float,
    counts: Counter[str] | None,
    tenants: list[tuple[str, str, str]],
) -> list[str]:
    codes = results.statuses()
    total = len(results.calls)
    errors = sum(v for k, v in codes.items() if k == 0 or k >= 500)
    refused = sum(v for k, v in codes.items() if 400 <= k < 500)
    lat = [s for _, st, s, _ in results.calls if st == 200]
    kvs = [s.kv for s in results.samples if s.kv is not None]
    rss = [(s.t, s.rss) for s in results.samples if s.rss is not None]
    warm_t = max(duration * 0.2, 10.0)
    warm = next((r for t, r in rss if t >= warm_t), rss[-1][1] if rss else None)
    plans = Counter(p for _, _, p in tenants)
    lines = [
        f"soak: {duration:.0f} s, {len(tenants)} tenants (plans: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(plans.items()))
        + "), mixed sizes (3/4 < 512 tokens, 1/4 in 512-2048)",
        "",
        "| measure | value |",
        "|---|---|",
        f"| requests | {total} ({total / duration:.1f}/s) |",
        f"| 200 | {codes.get(200, 0)} |",
        f"| refused 4xx (plans' limits) | {refused} "
        + "("
        + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items()) if 400 <= k < 500)
        + ") |",
        f"| errors (5xx, dropped) | {errors} ({errors / max(total, 1):.2%}) |",
        f"| latency p50 / p99 (200s) | {pct(lat, 0.5) * 1000:.0f} ms /"
        f" {pct(lat, 0.99) * 1000:.0f} ms |",
        f"| KV usage mean / max | {sum(kvs) / max(len(kvs), 1):.3f} / {max(kvs, default=0):.3f} |",
    ]
    if rss and warm:
        end = rss[-1][1]
        growth = (end - warm) / warm
        lines += [
            f"| RSS start / after warm-up ({warm_t:.0f} s) / end | {rss[0][1] / 2**20:.0f} /"
            f" {warm / 2**20:.0f} / {end / 2**20:.0f} MiB |",
            f"| RSS growth after warm-up | {growth:+.2%} (target < 5%:"
            f" {'met' if growth < 0.05 else 'MISSED'}) |",
        ]
    else:
        lines.append("| RSS | not exported by /metrics |")
    if counts is not None:
        served = {rid for _, st, _, rid in results.calls if st == 200 and rid}
        lost = len(served - set(counts))
        double = sum(1 for n in counts.values() if n > 1)
        extra = len(set(counts) - served)
        lines += [
            f"| ledger rows for the 200s | {len(served) - lost}/{len(served)} |",
            f"| ledger lost / double counted | {lost} / {double} |",
            f"| ledger rows of non-200 requests | {extra} (failed or cut requests are billed"
            " for what they used) |",
        ]
    else:
        lines.append("| ledger | not compared (no --database-url) |")
    series = ", ".join(f"{t:.0f}s {r / 2**20:.0f}" for t, r in rss[:: max(len(rss) // 12, 1)])
    lines += ["", f"RSS over time (MiB): {series}"]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--quick", action="store_true", help="60 s")
    parser.add_argument("--url", help="a running gateway (default: start the embedded one)")
    parser.add_argument("--admin-key", default=os.environ.get("HYDRANT_SOAK_ADMIN_KEY"))
    parser.add_argument("--database-url", help="its database, for the ledger comparison")
    parser.add_argument("--sample-every", type=float, default=5.0)
    args = parser.parse_args(argv)
    duration = 60.0 if args.quick else args.duration

    gateway = None
    base = Path(tempfile.mkdtemp(prefix="hydrant-soak-"))
    if args.url:
        if not args.admin_key:
            parser.error("--url needs --admin-key (or HYDRANT_SOAK_ADMIN_KEY)")
        url, admin_key, database_url = args.url, args.admin_key, args.database_url
    else:
        print(f"starting hydrant serve (embedded default) in {base} ...", flush=True)
        gateway = Gateway(base)
        url, admin_key, database_url = gateway.url, gateway.admin_key, gateway.database_url
    try:
        tenants = create_tenants(url, admin_key)
        print(f"load: {len(tenants)} tenants for {duration:.0f} s against {url}", flush=True)
        results = asyncio.run(run_load(url, tenants, duration, args.sample_every))
        counts = None
        if database_url:
            served = {rid for _, st, _, rid in results.calls if st == 200 and rid}
            counts = asyncio.run(settled_ledger(database_url, [t for t, _, _ in tenants], served))
        print("\n".join(["", *report(results, duration, counts, tenants)]))
    finally:
        if gateway is not None:
            gateway.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
