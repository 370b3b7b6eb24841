"""Decode tokens/s beside the bandwidth roofline: 8B- and 1.1B-shaped Llamas, fp16 and int4.

Run on a CUDA machine (about 2-3 minutes on an H200 for both shapes, CUDA graphs
captured and Triton kernels compiled included):

    python bench/gpu_decode.py --out /tmp/bench                 # 8b and 1.1b, fp16 and int4
    python bench/gpu_decode.py --out /tmp/bench --shapes 8b --quant none

The models are random (no hub access, and writing then reading 16 GB of
safetensors would spend a device slot on disk I/O): the engine's weight loader is
swapped for one that builds the model on the device and fills it with seeded
normal values, after which everything is the engine's own path (KV cache, decode
CUDA graphs, sampler, scheduler). Random weights do not change a decode step's
work: every weight byte is read once per step whatever its value.

The roofline of a decode step is the bytes it must read, each weight once plus
every running sequence's K/V, over the measured copy bandwidth (the faster of a
memcpy and a copy kernel, `gpu_common.copy_bandwidth`); tokens/s at the roofline
is the batch over that time. The decode window starts once every request has
its first token, so prefill is not in it.

Besides tokens/s, each batch-1 row splits a step's wall time into the GPU time
of the forward (CUDA events around the graph replay), the host's input
preparation, and the rest (scheduler, sampler with its device-to-host copy,
output processing): what keeps batch 1 from the roofline. `--profile` adds a
torch.profiler table of the host's busiest calls over 16 batch-1 steps.

`--smoke` runs a tiny model on the CPU (reference kernels, no graphs) to prove the
script before spending GPU time; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import SMOKE_LLAMA, START, copy_bandwidth, log

SHAPES: dict[str, dict[str, Any]] = {
    # Llama-3-8B: hidden 4096, 32 layers, GQA with 8 KV heads, MLP 14336, vocab 128256.
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
    },
    # TinyLlama-1.1B.
    "1.1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "smoke": SMOKE_LLAMA,
}
BATCHES = (1, 8, 64)
PROMPT_LEN = 128
DEADLINE_S = 200.0  # the run stops starting new parts here (gpu_device.sh's slot)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_loader(seed: int) -> Callable[..., Any]:
    """A stand-in for `load_engine_model`: the model built on the device, seeded random."""
    from hydrant.engine.model import LlamaForCausalLM
    from hydrant.engine.quantized_weights import log_report
    from hydrant.kernels.quantization import quantize_model

    def load(
        model_dir: Path,
        model_config: Any,
        config: Any,
        dtype: torch.dtype,
        max_model_len: int,
        ops: Any,
    ) -> Any:
        with torch.device("meta"):
            model = LlamaForCausalLM(model_config, ops)
        model.to_empty(device=config.device)
        gen = torch.Generator(device=config.device).manual_seed(seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, 0.02, generator=gen)
        model.to(dtype)
        model.init_rope(max_model_len)
        if config.quantization is not None:
            log_report(quantize_model(model, config.quantization))
        return model.eval()

    return load


@contextmanager
def random_weights(seed: int = 0) -> Iterator[None]:
    from hydrant.engine import model_runner

    original = model_runner.load_engine_model
    model_runner.load_engine_model = random_loader(seed)
    try:
        yield
    finally:
        model_runner.load_engine_model = original


def step_bytes(model: Any, shape: dict[str, Any], contexts: float, kv_bytes_per_elem: int) -> float:
    """Bytes one decode step reads: every weight but the embedding table, plus the K/V."""
    weights = 0
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if "embed_tokens" in name or name == "cos_sin_cache":
            continue
        weights += tensor.numel() * tensor.element_size()
    head_dim = shape["hidden_size"] // shape["num_attention_heads"]
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * head_dim
    return weights + per_token * kv_bytes_per_elem * contexts


class StepClock:
    """Wall time of each engine step, and the GPU time of each decode graph replay."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.device = engine.runner.device
        self.prepare_s: list[float] = []
        self.replay_events: list[tuple[Any, Any]] = []
        runner = engine.runner
        prepare = runner._prepare

        def timed_prepare(items: Any) -> Any:
            started = time.perf_counter()
            result = prepare(items)
            self.prepare_s.append(time.perf_counter() - started)
            return result

        runner._prepare = timed_prepare
        graphs = getattr(runner, "decode_graphs", None)
        if graphs is not None and self.device.type == "cuda":
            replay = graphs._replay

            def timed_replay(size: int) -> torch.Tensor:
                begin = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                begin.record()
                logits = replay(size)
                end.record()
                self.replay_events.append((begin, end))
                return logits

            graphs._replay = timed_replay

    def reset(self) -> None:
        self.prepare_s.clear()
        self.replay_events.clear()

    def gpu_forward_s(self) -> list[float]:
        _sync(self.device)
        return [b.elapsed_time(e) / 1e3 for b, e in self.replay_events]


def decode_run(
    engine: Any, clock: StepClock, batch: int, new_tokens: int, vocab: int, tag: str
) -> dict[str, Any]:
    """Submit `batch` requests at once; time the steps after every request has a token."""
    from hydrant.engine.sampling_params import SamplingParams
    from hydrant.engine.sequence import Request

    params = SamplingParams(
        max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0, ignore_eos=True
    )
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
        engine.add_request(Request(f"{tag}-{batch}-{i}", prompt, params))
    started_with_tokens: set[str] = set()
    step_walls: list[float] = []
    window_start: float | None = None
    clock.reset()
    decode_prepares = 0
    while engine.has_unfinished():
        begin = time.perf_counter()
        outputs = engine.step()
        end = time.perf_counter()
        if window_start is not None:
            step_walls.append(end - begin)
        for out in outputs:
            if out.outputs and out.outputs[0].token_ids:
                started_with_tokens.add(out.request_id)
        if window_start is None and len(started_with_tokens) == batch:
            window_start = end
            decode_prepares = len(clock.prepare_s)
    window = sum(step_walls)
    decode_steps = len(step_walls)
    gpu = clock.gpu_forward_s()[-decode_steps:] if decode_steps else []
    prepare = clock.prepare_s[decode_prepares:]
    row: dict[str, Any] = {
        "batch": batch,
        "decode_steps": decode_steps,
        "tokens_per_s": batch * decode_steps / window if window > 0 else 0.0,
        "step_ms": 1e3 * window / max(decode_steps, 1),
        "graph_replays": len(gpu),
    }
    if gpu and len(gpu) == decode_steps:
        row["gpu_forward_ms"] = 1e3 * sum(gpu) / len(gpu)
    if prepare:
        row["prepare_ms"] = 1e3 * sum(prepare) / len(prepare)
    if "gpu_forward_ms" in row:
        row["host_other_ms"] = row["step_ms"] - row["gpu_forward_ms"] - row.get("prepare_ms", 0.0)
    return row


def replay_only_ms(graphs: Any, device: torch.device, replays: int = 50) -> float:
    """Milliseconds per replay of the batch-1 decode graph with nothing between replays.

    Its slot is set to padding first, so the replays write no K/V into a freed block
    the prefix cache could hand to a later request.
    """
    from hydrant.engine.cuda_graphs import PAD_SLOT

    graphs.slot_mapping[:1].fill_(PAD_SLOT)
    graphs._replay(1)
    _sync(device)
    started = time.perf_counter()
    for _ in range(replays):
        graphs._replay(1)
    _sync(device)
    return 1e3 * (time.perf_counter() - started) / replays


def profile_batch1(engine: Any, vocab: int, out_dir: Path, tag: str) -> str:
    """torch.profiler over 16 batch-1 decode steps: the host calls a step spends its time in."""
    from torch.profiler import ProfilerActivity, profile

    from hydrant.engine.sampling_params import SamplingParams
    from hydrant.engine.sequence import Request

    params = SamplingParams(max_tokens=40, min_tokens=40, temperature=0.0, ignore_eos=True)
    engine.add_request(Request(f"{tag}-profile", list(range(1, PROMPT_LEN + 1)), params))
    for _ in range(8):  # prefill and the first decodes outside the window
        engine.step()
    activities = [ProfilerActivity.CPU]
    if engine.runner.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(16):
            engine.step()
    while engine.has_unfinished():
        engine.step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    (out_dir / f"profile_{tag}.txt").write_text(table)
    try:
        prof.export_chrome_trace(str(out_dir / f"trace_{tag}.json"))
    except Exception as exc:  # the table is what matters; a trace is a bonus
        log(f"chrome trace not written: {exc}")
    return table


def bench_shape(
    name: str,
    quant: str | None,
    device: torch.device,
    copy_gbps: float,
    new_tokens: int,
    out_dir: Path,
    profile: bool,
) -> list[dict[str, Any]]:
    from transformers import LlamaConfig

    from hydrant.engine.engine_config import EngineConfig
    from hydrant.engine.llm_engine import LLMEngine

    shape = SHAPES[name]
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    tag = f"{name}-{quant or 'fp16'}"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, random_weights():
        LlamaConfig(**shape, architectures=["LlamaForCausalLM"], torch_dtype=dtype).save_pretrained(
            tmp
        )
        # No weights on disk (they are made on the device); the index names the LM head
        # so the config reader does not take the model for an embedding-only one.
        index = {"weight_map": {"lm_head.weight": "model.safetensors"}}
        (Path(tmp) / "model.safetensors.index.json").write_text(json.dumps(index))
        started = time.perf_counter()
        engine: Any = LLMEngine.from_pretrained(
            Path(tmp),
            EngineConfig(
                device=str(device),
                dtype=str(dtype).split(".")[-1],
                show_progress=False,
                max_num_seqs=max(BATCHES),
                max_model_len=PROMPT_LEN + new_tokens + 64,
                quantization=quant,
            ),
        )
        load_s = time.perf_counter() - started
        graphs = getattr(engine.runner, "decode_graphs", None)
        log(f"{tag}: engine ready in {load_s:.1f}s (decode graphs: {graphs is not None})")
        clock = StepClock(engine)
        decode_run(engine, clock, 1, 8, shape["vocab_size"], f"{tag}-warm")
        kv_elem = 1 if engine.runner.kv_int8 else torch.finfo(dtype).bits // 8
        for batch in BATCHES:
            if time.perf_counter() - START > DEADLINE_S:
                log(f"deadline: {tag} batch {batch} skipped")
                break
            row = decode_run(engine, clock, batch, new_tokens, shape["vocab_size"], tag)
            contexts = batch * (PROMPT_LEN + new_tokens / 2)
            nbytes = step_bytes(engine.runner.model, shape, contexts, kv_elem)
            roofline = batch / (nbytes / (copy_gbps * 1e9))
            row.update(
                model=name,
                weights=quant or "fp16",
                step_mb=nbytes / 1e6,
                roofline_tokens_per_s=roofline,
                share_of_roofline=row["tokens_per_s"] / roofline,
            )
            rows.append(row)
            log(
                f"{tag} batch {batch}: {row['tokens_per_s']:.1f} tok/s, "
                f"{row['share_of_roofline']:.0%} of the roofline ({roofline:.1f}), "
                f"step {row['step_ms']:.3f} ms, gpu {row.get('gpu_forward_ms', 0):.3f} ms, "
                f"prepare {row.get('prepare_ms', 0):.3f} ms"
            )
        if graphs is not None and rows and rows[0]["batch"] == 1:
            # The batch-1 graph replayed back to back, no host work between: the step time
            # a perfectly overlapped host (vLLM's async scheduling) would leave.
            replay_ms = replay_only_ms(graphs, device)
            rows[0]["replay_only_ms"] = replay_ms
            rows[0]["replay_only_tokens_per_s"] = 1e3 / replay_ms
            log(f"{tag} batch 1: graph replays alone {replay_ms:.3f} ms a step")
        if profile and time.perf_counter() - START < DEADLINE_S:
            print(profile_batch1(engine, shape["vocab_size"], out_dir, tag))
        engine = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    columns = [
        ("model", "model"),
        ("weights", "weights"),
        ("batch", "batch"),
        ("tokens_per_s", "tok/s"),
        ("roofline_tokens_per_s", "roofline tok/s"),
        ("share_of_roofline", "of roofline"),
        ("step_ms", "step ms"),
        ("gpu_forward_ms", "GPU fwd ms"),
        ("prepare_ms", "prepare ms"),
        ("host_other_ms", "rest ms"),
        ("replay_only_tokens_per_s", "replays alone tok/s"),
        ("vs_fp16", "vs fp16"),
    ]
    print("\n== decode tokens/s beside the roofline (weights + KV bytes / copy bandwidth)")
    print("| " + " | ".join(title for _, title in columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key, "")
            if key == "share_of_roofline" and value != "":
                cells.append(f"{value:.0%}")
            elif isinstance(value, float):
                cells.append(f"{value:,.3f}" if value < 100 else f"{value:,.0f}")
            else:
                cells.append(str(value))
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_decode.json")
    parser.add_argument("--shapes", default="8b,1.1b", help="comma-separated: 8b, 1.1b")
    parser.add_argument("--quant", default="none,int4", help="comma-separated: none, int8, int4")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--profile", action="store_true", help="torch.profiler on batch 1")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU")
    args = parser.parse_args(argv)
    if args.smoke:
        device, shapes, new_tokens = torch.device("cpu"), ["smoke"], 6
    elif torch.cuda.is_available():
        device, shapes, new_tokens = torch.device("cuda"), args.shapes.split(","), args.new_tokens
        log(f"device: {torch.cuda.get_device_name(device)}")
    else:
        parser.error("needs CUDA, or --smoke")
    quants = [None if q == "none" else q for q in args.quant.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    copy = copy_bandwidth(device, args.smoke)
    log(f"copy bandwidth {copy['gbps']:.0f} GB/s ({copy['timing']})")
    rows: list[dict[str, Any]] = []
    for name in shapes:
        for quant in quants:
            if time.perf_counter() - START > DEADLINE_S:
                log(f"deadline: {name} {quant} skipped")
                continue
            try:
                rows += bench_shape(
                    name, quant, device, copy["gbps"], new_tokens, args.out, args.profile
                )
            except Exception as exc:  # report and go on: one failing part must not hide the rest
                log(f"{name} {quant or 'fp16'} failed: {type(exc).__name__}: {exc}")
                rows.append({"model": name, "weights": quant or "fp16", "error": str(exc)})
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            (args.out / "gpu_decode.json").write_text(
                json.dumps({"copy": copy, "rows": rows}, indent=1, default=str)
            )
    fp16 = {
        (r["model"], r["batch"]): r["tokens_per_s"]
        for r in rows
        if r.get("weights") == "fp16" and "batch" in r
    }
    for row in rows:
        base = fp16.get((row.get("model"), row.get("batch")))
        if base and row.get("weights") != "fp16":
            row["vs_fp16"] = row["tokens_per_s"] / base
    print_table([r for r in rows if "batch" in r])
    for row in rows:
        if "error" in row:
            print(f"{row['model']} {row['weights']}: ERROR {row['error']}")
    (args.out / "gpu_decode.json").write_text(
        json.dumps({"copy": copy, "rows": rows}, indent=1, default=str)
    )
    return rows


if __name__ == "__main__":
    main()
