"""Gateway overhead at load: auth + quotas (Redis) + ledger (PostgreSQL), short requests.

    .venv/bin/python bench/gateway.py [--quick] [--profile] [--levels 1,4,16,...]
        [--rates 100,200,...] [--ledger-commit journal|database] [--client raw|httpx]
        [--engine inprocess|worker] [--rounds N]

Overhead is what a request costs outside the engine: the client's latency
minus the time the gateway waited on the engine for that request (measured in
the gateway process around the engine client, per request id; see
`gateway_harness.py`). `in-app` is the same without the HTTP server and the
client: from the ASGI app being called to its last body message, minus the
engine. `own` is the overhead less the request's wait for its durable ledger
write (`ledger`: one disk flush, PostgreSQL's commit or the journal's fsync),
so the table shows how much of the overhead is the gateway's work and how
much is the disk's; the target is about `ovh`, the whole of it. The baseline
sends the same requests (`max_tokens` 1) at the same concurrency straight to
the same in-process engine: no HTTP, no auth, quotas or ledger. Levels rise
until throughput stops growing. Not part of the tests.
`--ledger-commit` picks where a response's ledger entry is durable before it
is sent (`HYDRANT_LEDGER_COMMIT`, default as the server's): PostgreSQL's
commit (database), or the fsync'd local journal moved into PostgreSQL in
batches (journal).

`--engine` picks where the engine runs: in one `hydrant worker` process that
the gateway's local scaler starts and dispatches to over HTTP (worker pools,
the production layout with Redis and PostgreSQL, and the default here), or in
the gateway's process (the embedded layout: its step thread shares the
gateway's interpreter and GIL, so the engine's Python work shows as overhead).
In worker mode the engine clock runs while the gateway awaits the worker's
stream, as LiteLLM's overhead header does around its LLM call; the gateway's
own client work inside that wait shows in `cpu gw` / `cpu lp`, not in `ovh`.

The client (`--client raw`, the default) is a minimal HTTP/1.1 keep-alive
client on asyncio streams: one connection per concurrent client, the request
bytes built once, the response read by its Content-Length. Its latency is the
gateway's time plus the loopback and a few microseconds of parsing. Until
2026-12 this bench used httpx, whose own CPU (~0.5 ms a request here, more at
load, on the same two cores as the gateway) was counted as gateway overhead;
`--client httpx` still measures that way, for comparison.

`--rates` replaces the concurrency levels (a closed loop: each client sends
its next request when the last one is answered, so the load adapts to the
server) with offered loads (an open loop: requests arrive at the given rate,
Poisson-spaced, whether or not earlier ones are answered, each on an idle
keep-alive connection or a new one), which is how "overhead at N requests per
second" is usually meant; the table then ends with the highest rate at which
the target held. A request's clock starts when it is written, so a client
running behind its schedule (`late`: the p99 of how far behind, in ms) shows as
a lower achieved rate, not as gateway time.

Anchor: LiteLLM publishes 2 ms p50 / 13 ms p99 overhead at ~1,000 RPS over 4
instances; the target here is p50 <= 2 ms and p99 <= 10 ms in one process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import secrets
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_harness import MESSAGES, run_gateway

from hydrant.platform.db import migrate
from hydrant.platform.keys import generate_key

BODY = {"model": "demo", "messages": MESSAGES, "max_tokens": 1, "temperature": 0}
# Limits far above the load, so every request runs the Redis script (window, tokens,
# concurrency, budget checks) and none is refused.
PLAN = {
    "requests_per_minute": 2**31 - 1,
    "tokens_per_minute": 2**62,
    "max_concurrent_requests": 100_000,
    "spend_per_month": "1000000",
}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Level:
    concurrency: int  # closed loop: the clients; open loop: the most requests in flight at once
    rps: float
    base_rps: float
    latency_p50: float
    base_p50: float
    over_p50: float
    over_p99: float
    own_p50: float
    own_p99: float
    app_p50: float
    app_p99: float
    errors: int
    admit_p50: float
    settle_p50: float
    ledger_p50: float
    cpu_gw: float
    cpu_loop: float
    cpu_eng: float
    phase_cpu: dict[str, float]
    rate: float = 0.0  # the offered load of an open-loop run (requests/s); 0 in a closed loop
    late_p99: float = 0.0  # open loop: how far behind its schedule a request was written

    def meets_target(self) -> bool:
        return self.over_p50 <= TARGET_P50 and self.over_p99 <= TARGET_P99 and not self.errors

    def row(self) -> str:
        ms = 1000
        load = (
            f"{self.rate:>6.0f} {self.concurrency:>5} {self.late_p99 * ms:>6.2f}"
            if self.rate
            else f"{self.concurrency:>5}"
        )
        return (
            f"{load} {self.rps:>8.1f} {self.base_rps:>8.1f} "
            f"{self.rps / self.base_rps:>6.2f} {self.latency_p50 * ms:>8.2f} "
            f"{self.base_p50 * ms:>8.2f} {self.over_p50 * ms:>8.2f} {self.over_p99 * ms:>8.2f} "
            f"{self.own_p50 * ms:>8.2f} {self.own_p99 * ms:>8.2f} "
            f"{self.app_p50 * ms:>8.2f} {self.app_p99 * ms:>8.2f} {self.admit_p50 * ms:>7.2f} "
            f"{self.settle_p50 * ms:>7.2f} {self.ledger_p50 * ms:>7.2f} "
            f"{self.cpu_gw * ms:>7.2f} {self.cpu_loop * ms:>7.2f} {self.cpu_eng * ms:>7.2f} "
            f"{self.errors:>5}"
        )


TARGET_P50, TARGET_P99 = 0.002, 0.010  # the target for the overhead (seconds)


def header(open_loop: bool) -> str:
    load = f"{'rate':>6} {'peak':>5} {'late':>6}" if open_loop else f"{'conc':>5}"
    return load + HEADER


HEADER = (
    f" {'gw rps':>8} {'eng rps':>8} {'ratio':>6} {'gw p50':>8} {'eng p50':>8} "
    f"{'ovh p50':>8} {'ovh p99':>8} {'own p50':>8} {'own p99':>8} {'app p50':>8} {'app p99':>8} "
    f"{'admit':>7} {'settle':>7} "
    f"{'ledger':>7} {'cpu gw':>7} {'cpu lp':>7} {'cpu eng':>7} {'err':>5}"
)


class Harness:
    """The gateway child process and the pipe to it."""

    def __init__(self, config: dict[str, Any]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=run_gateway, args=(child, config), daemon=True)
        self.process.start()
        child.close()

    def ask(self, command: str, argument: Any = None, timeout_s: float = 600) -> Any:
        if command != "ready":
            self.conn.send((command, argument))
        if not self.conn.poll(timeout_s):
            raise TimeoutError(f"the gateway did not answer {command!r}")
        kind, value = self.conn.recv()
        if kind == "error":
            raise RuntimeError(f"the gateway failed: {value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(("stop", None))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


Result = tuple[list[tuple[str, float]], float, int]


async def load_httpx(base_url: str, key: str, concurrency: int, count: int) -> Result:
    """`count` requests from `concurrency` httpx clients: (request id, latency), wall, errors."""
    results: list[tuple[str, float]] = []
    errors = 0
    remaining = count
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, limits=limits, timeout=120
    ) as client:

        async def worker() -> None:
            nonlocal remaining, errors
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json=BODY)
                elapsed = time.perf_counter() - started
                if response.status_code == 200:
                    results.append((response.headers["x-request-id"], elapsed))
                else:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results, time.perf_counter() - started, errors


def request_bytes(base_url: str, key: str) -> bytes:
    """The whole HTTP/1.1 request, built once: every request of the run is these bytes."""
    body = json.dumps(BODY).encode()
    host = urlsplit(base_url).netloc
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """Status and headers (lower-case names) of one response; its body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head[:-4].split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if b"content-length" not in headers:  # every non-streamed answer of the gateway has one
        raise RuntimeError(f"a response without Content-Length: {head!r}")
    await reader.readexactly(int(headers[b"content-length"]))
    return status, headers


async def load_raw(base_url: str, key: str, concurrency: int, count: int) -> Result:
    """`count` requests over `concurrency` keep-alive connections: (request id, latency), wall,
    errors."""
    results: list[tuple[str, float]] = []
    errors = 0
    remaining = count
    request = request_bytes(base_url, key)
    parts = urlsplit(base_url)
    connections = [
        await asyncio.open_connection(parts.hostname, parts.port) for _ in range(concurrency)
    ]

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal remaining, errors
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter()
            writer.write(request)
            status, headers = await read_response(reader)
            elapsed = time.perf_counter() - started
            if status == 200:
                results.append((headers[b"x-request-id"].decode(), elapsed))
            else:
                errors += 1

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(r, w) for r, w in connections))
        return results, time.perf_counter() - started, errors
    finally:
        for _, writer in connections:
            writer.close()


async def load_open(
    base_url: str, key: str, rate: float, count: int, seed: int = 0
) -> tuple[Result, int, float]:
    """`count` requests arriving at `rate` per second, Poisson-spaced (an open loop), each on an
    idle keep-alive connection or a new one: the result, the most in flight, the p99 lateness."""
    results: list[tuple[str, float]] = []
    late: list[float] = []
    errors = 0
    request = request_bytes(base_url, key)
    parts = urlsplit(base_url)
    Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]

    async def connect() -> Conn:
        return await asyncio.open_connection(parts.hostname, parts.port)

    # Enough for the expected in-flight count (rate x ~20 ms) without opening any mid-run.
    idle: list[Conn] = [await connect() for _ in range(min(count, max(4, int(rate * 0.02) + 4)))]
    opened = list(idle)
    in_flight = peak = 0

    async def one() -> None:
        nonlocal errors, in_flight, peak
        connection = idle.pop() if idle else await connect()
        if connection not in opened:
            opened.append(connection)
        reader, writer = connection
        in_flight += 1
        peak = max(peak, in_flight)
        started = time.perf_counter()
        writer.write(request)
        status, headers = await read_response(reader)
        elapsed = time.perf_counter() - started
        in_flight -= 1
        idle.append(connection)
        if status == 200:
            results.append((headers[b"x-request-id"].decode(), elapsed))
        else:
            errors += 1

    rng = random.Random(seed)
    tasks = []
    try:
        started = time.perf_counter()
        due = started
        for _ in range(count):
            due += rng.expovariate(rate)
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            late.append(max(0.0, time.perf_counter() - due))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return (results, time.perf_counter() - started, errors), peak, pct(late, 0.99)
    finally:
        for _, writer in opened:
            writer.close()


CLIENTS = {"raw": load_raw, "httpx": load_httpx}


def measure(
    harness: Harness,
    base_url: str,
    key: str,
    concurrency: int,
    count: int,
    client: str = "raw",
    rate: float = 0.0,
) -> Level:
    """One level: `concurrency` closed-loop clients, or with `rate`, an open loop at that rate
    (its baseline then runs at the open loop's peak concurrency)."""
    harness.ask("times")  # start the CPU clocks here
    late = 0.0
    if rate:
        (results, wall, errors), concurrency, late = asyncio.run(
            load_open(base_url, key, rate, count)
        )
    else:
        results, wall, errors = asyncio.run(CLIENTS[client](base_url, key, concurrency, count))
    engine, in_app, phases, (gw_cpu, loop_cpu) = harness.ask("times")
    over = [lat - engine[rid] for rid, lat in results if rid in engine]
    own = [
        lat - engine[rid] - phases[rid]["ledger"]
        for rid, lat in results
        if rid in engine and "ledger" in phases.get(rid, {})
    ]
    app = [in_app[rid] - engine[rid] for rid, _ in results if rid in engine and rid in in_app]
    base_latencies, base_wall, (base_cpu, _) = harness.ask("baseline", (concurrency, count))
    return Level(
        concurrency=concurrency,
        rate=rate,
        late_p99=late,
        rps=len(results) / wall,
        base_rps=len(base_latencies) / base_wall,
        latency_p50=pct([lat for _, lat in results], 0.5),
        base_p50=pct(base_latencies, 0.5),
        over_p50=pct(over, 0.5),
        over_p99=pct(over, 0.99),
        own_p50=pct(own, 0.5),
        own_p99=pct(own, 0.99),
        app_p50=pct(app, 0.5),
        app_p99=pct(app, 0.99),
        errors=errors,
        admit_p50=pct([p["admit"] for p in phases.values() if "admit" in p], 0.5),
        settle_p50=pct([p["settle"] for p in phases.values() if "settle" in p], 0.5),
        ledger_p50=pct([p["ledger"] for p in phases.values() if "ledger" in p], 0.5),
        cpu_gw=gw_cpu / max(1, len(results)),
        cpu_loop=loop_cpu / max(1, len(results)),
        cpu_eng=base_cpu / max(1, len(base_latencies)),
        phase_cpu={
            name: pct([p[name + "_cpu"] for p in phases.values() if name + "_cpu" in p], 0.5)
            for name in ("admit", "settle", "ledger")
        },
    )


def median_level(rounds: list[Level]) -> Level:
    """Each column's median over repeated rounds of one level (one round: itself)."""
    if len(rounds) == 1:
        return rounds[0]
    columns: dict[str, Any] = {}
    for name in Level.__dataclass_fields__:
        values = [getattr(r, name) for r in rounds]
        if name == "phase_cpu":
            columns[name] = {k: statistics.median(v[k] for v in values) for k in values[0]}
        elif name == "errors":
            columns[name] = sum(values)
        else:
            columns[name] = statistics.median(values)
    # Closed loop: the level itself; open loop: the most in flight in any round.
    columns["concurrency"] = max(r.concurrency for r in rounds)
    return Level(**columns)


def setup(base: Path, postgres: str) -> tuple[str, str]:
    """A fresh database (migrated) and the demo model: (database url, model dir)."""
    from hydrant.engine.demo_model import write_demo_model

    name = f"hydrant_bench_{secrets.token_hex(4)}"
    asyncio.run(_admin_sql(postgres, f'CREATE DATABASE "{name}"'))
    url = f"{postgres}/{name}"
    migrate.upgrade(url)
    return url, str(write_demo_model(base / "model"))


async def _admin_sql(postgres: str, sql: str) -> None:
    connection = await asyncpg.connect(
        postgres.replace("postgresql+asyncpg", "postgresql") + "/postgres"
    )
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def tenant_key(base_url: str, admin_key: str) -> str:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {admin_key}"}) as c:
        plan = c.post("/admin/plans", json={"name": "bench", **PLAN}).raise_for_status().json()
        tenant = c.post("/admin/tenants", json={"name": "bench", "plan": plan["id"]})
        tenant_id = tenant.raise_for_status().json()["id"]
        key = c.post("/admin/keys", json={"tenant_id": tenant_id}).raise_for_status()
        return str(key.json()["secret"])


def forget_workers(redis_url: str, prefix: str) -> None:
    """Delete the worker registry keys of this run (worker mode)."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 levels, few requests")
    parser.add_argument("--levels", help="concurrency levels, e.g. 1,4,16,64")
    parser.add_argument(
        "--rates",
        help="open-loop offered loads in requests/s instead of concurrency levels, e.g."
        " 100,200,400 (Poisson arrivals; ends with the highest rate that met the target)",
    )
    parser.add_argument("--requests", type=int, help="requests per level")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each level this many times (each with its baseline) and print the"
        " median of every column: on a noisy machine one run can be 30%% off",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the last level")
    parser.add_argument("--profile-out", help="with --profile: also write the pstats file here")
    parser.add_argument("--postgres", default="postgresql+asyncpg://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--ledger-commit",
        choices=("database", "journal"),
        default="database",
        help="HYDRANT_LEDGER_COMMIT of the gateway under test",
    )
    parser.add_argument(
        "--engine",
        choices=("inprocess", "worker"),
        default="worker",
        help="the engine in a `hydrant worker` process the gateway dispatches to over HTTP"
        " (worker pools, the default) or in the gateway's process (the embedded layout)",
    )
    parser.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default="raw",
        help="the load client: raw asyncio streams (default) or httpx (counts its CPU too)",
    )
    args = parser.parse_args(argv)
    levels = [
        int(x) for x in (args.levels or ("1,4,16" if args.quick else "1,2,4,8,16,32,64")).split(",")
    ]
    rates = [float(x) for x in args.rates.split(",")] if args.rates else []
    if rates and args.client != "raw":
        parser.error("--rates uses the raw client")
    count = args.requests or (60 if args.quick else 400)

    with tempfile.TemporaryDirectory(prefix="hydrant-bench-") as scratch:
        print("preparing: database, migrations, demo model", flush=True)
        database_url, model_dir = setup(Path(scratch), args.postgres)
        admin_key = generate_key("test").secret
        port = free_port()
        config = {
            "data_dir": str(Path(scratch) / "data"),
            "database_url": database_url,
            "redis_url": args.redis,
            "model_dir": model_dir,
            "admin_key": admin_key,
            "secret_key": secrets.token_urlsafe(48),
            "port": port,
            "ledger_commit": args.ledger_commit,
            "profile_out": args.profile_out,
            "engine": args.engine,
            "worker_secret": secrets.token_urlsafe(24),
            "worker_prefix": f"hydrant-bench:{secrets.token_hex(4)}",
        }
        print("starting the gateway (auth + Redis quotas + PostgreSQL ledger)", flush=True)
        harness = Harness(config)
        try:
            harness.ask("ready")
            base_url = f"http://127.0.0.1:{port}"
            key = tenant_key(base_url, admin_key)
            print("warming up", flush=True)
            measure(harness, base_url, key, 4, 40, args.client)
            rows: list[Level] = []
            loads = [(0, rate) for rate in rates] or [(c, 0.0) for c in levels]
            for number, (concurrency, rate) in enumerate(loads):
                profiling = args.profile and number == len(loads) - 1
                if profiling:
                    harness.ask("profile_start")
                level = median_level(
                    [
                        measure(harness, base_url, key, concurrency, count, args.client, rate)
                        for _ in range(args.rounds)
                    ]
                )
                if profiling:
                    print(harness.ask("profile_stop"))
                rows.append(level)
                name = f"rate {rate:>5.0f}/s" if rate else f"level {concurrency:>3}"
                print(
                    f"{name}: {level.rps:7.1f} req/s, overhead p50 "
                    f"{level.over_p50 * 1000:.2f} ms, p99 {level.over_p99 * 1000:.2f} ms",
                    flush=True,
                )
                best = max(r.rps for r in rows[:-1]) if len(rows) > 1 else 0.0
                if not (args.levels or rates) and len(rows) >= 3 and level.rps < 1.05 * best:
                    print("throughput stopped growing: highest sustained load reached", flush=True)
                    break
        finally:
            harness.close()
            forget_workers(args.redis, config["worker_prefix"])
            asyncio.run(
                _admin_sql(
                    args.postgres,
                    f'DROP DATABASE IF EXISTS "{database_url.rsplit("/", 1)[1]}" WITH (FORCE)',
                )
            )
    print()
    print(f"ledger commit: {args.ledger_commit} (the entry is durable there before the 200)")
    print(f"client: {args.client}")
    print(f"engine: {args.engine}")
    rounds = f", median of {args.rounds} rounds" if args.rounds > 1 else ""
    print(
        f"{count} requests per level{rounds}, max_tokens 1; times in ms;"
        " ovh = client latency - engine;"
    )
    print("own = ovh - the wait for the durable ledger write (ledger);")
    print("app = in the ASGI app - engine; eng = the same requests straight to the engine;")
    print("admit/settle = quota script (Redis) p50; ledger = the entry's durable write p50;")
    print("cpu = CPU ms per request: gateway process (gw), its event loop thread alone (lp),")
    print("and the process for the same request straight to the engine (eng)")
    if rates:
        print("open loop: rate = offered requests/s (Poisson); peak = most in flight at once;")
        print("late = p99 of how far behind schedule the client wrote a request (ms)")
    print(header(bool(rates)))
    for level in rows:
        print(level.row())
    if rates:
        held = [level for level in rows if level.meets_target()]
        target = f"ovh p50 <= {TARGET_P50 * 1000:g} ms and p99 <= {TARGET_P99 * 1000:g} ms"
        if held:
            best = max(held, key=lambda level: level.rate)
            print(
                f"highest offered rate meeting the target ({target}): {best.rate:.0f} req/s"
                f" (served {best.rps:.0f} req/s)"
            )
        else:
            print(f"no offered rate met the target ({target})")
    first = rows[0]
    if first.concurrency == 1:
        parts = ", ".join(f"{k} {v * 1000:.2f}" for k, v in first.phase_cpu.items())
        loop_ms = first.cpu_loop * 1000
        print(f"concurrency 1, event-loop CPU ms per request: {loop_ms:.2f} in all; {parts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
