"""GPU kernel benchmark: paged decode attention bandwidth, W4A16/W8A16 vs float16, e2e decode.

Run on a CUDA machine in one go (about 2-4 minutes on an H200, Triton compiles included):

    python bench/gpu_kernels.py --out /tmp/bench            # kernels only
    python bench/gpu_kernels.py --out /tmp/bench --e2e      # + engine vs transformers decode

It prints a table per section and writes `gpu_kernels.json` under `--out`.
Targets: decode attention >= 70% of measured copy bandwidth; W4A16 at M=1 at
least as fast as gemlite's best kernel on the same codes (`gpu_gemlite.py`,
when the gemlite wheel is installed), and at M=64 not slower than float16
`torch.matmul` (printed as pass True/False, never asserted).
Every kernel is first checked against its PyTorch reference at the bench
shape, so a fast wrong kernel shows up as an error, not a win.

Timing replays a CUDA graph of repeated calls (the Python launch cost of a
small kernel would otherwise be what is measured) over enough copies of the
operands to defeat the 50 MB L2; it falls back to eager loops if capture fails.

`--smoke` runs tiny shapes on the CPU under `TRITON_INTERPRET=1` to prove the
script has no bugs before spending GPU time; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import (
    SMOKE_LLAMA,
    START,
    copies_for,
    copy_bandwidth,
    decode_inputs,
    log,
    rel_err,
    time_calls,
)

DEADLINE_S = 330.0  # leave room under the 6-minute budget for the e2e teardown
TUNE_DEADLINE_S = 150.0  # `--tune` stops sweeping here, so the tables after it still run


def decode_cases(smoke: bool) -> list[dict[str, Any]]:
    if smoke:
        return [
            {"batch": 2, "context": 40, "heads": 8, "kv_heads": 2, "head_dim": 64, "kv": "float16"},
            {"batch": 2, "context": 40, "heads": 8, "kv_heads": 2, "head_dim": 64, "kv": "int8"},
        ]
    llama8b = {"heads": 32, "kv_heads": 8, "head_dim": 128}
    return [
        {"batch": 64, "context": 2048, **llama8b, "kv": "float16"},
        {"batch": 64, "context": 2048, **llama8b, "kv": "int8"},
        {"batch": 8, "context": 8192, **llama8b, "kv": "float16"},
        {"batch": 1, "context": 32768, **llama8b, "kv": "float16"},
    ]


def bench_decode(
    case: dict[str, Any], device: torch.device, copy_gbps: float, smoke: bool
) -> dict[str, Any]:
    from hydrant.kernels import ops, reference

    keys = ("batch", "context", "heads", "kv_heads", "head_dim", "kv")
    inputs = decode_inputs(*(case[k] for k in keys), device)
    operands = (inputs.q, inputs.k, inputs.v, inputs.tables, inputs.lens, case["head_dim"] ** -0.5)

    def run() -> torch.Tensor:
        return ops.paged_decode_attention(*operands, **inputs.scales, backend="triton")

    err = rel_err(run(), reference.paged_decode_attention(*operands, **inputs.scales))
    kv_bytes = inputs.kv_bytes
    seconds, mode = time_calls([run], device, reps=1 if smoke else 20)
    gbps = kv_bytes / seconds / 1e9
    share = gbps / copy_gbps
    return {
        **case,
        "rel_err": err,
        "us": seconds * 1e6,
        "gbps": gbps,
        "share_of_copy": share,
        "target": 0.70,
        "pass": share >= 0.70,
        "timing": mode,
    }


def correctness_sweep(device: torch.device, smoke: bool) -> list[dict[str, Any]]:
    """Every op once on the Triton path against its reference (compiles each kernel too)."""
    from hydrant.kernels import ops, reference

    gen = torch.Generator(device=device).manual_seed(1)
    t, hidden, h, hkv, d, bs = (12, 256, 8, 2, 64, 16) if smoke else (512, 4096, 32, 8, 128, 16)
    f16 = torch.float16

    def randn(*shape: int, dtype: torch.dtype = f16) -> torch.Tensor:
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    rows: list[dict[str, Any]] = []

    def record(name: str, out: torch.Tensor, ref: torch.Tensor, tol: float = 3e-3) -> None:
        err = rel_err(out, ref)
        rows.append({"op": name, "rel_err": err, "pass": err < tol})

    x, res, w = randn(t, hidden), randn(t, hidden), randn(hidden)
    record(
        "rms_norm+residual",
        ops.rms_norm(x, w, 1e-5, res, backend="triton")[0],
        reference.rms_norm(x, w, 1e-5, res)[0],
    )
    table = ops.build_rope_cache(
        d,
        8192,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        f16,
        device,
    )
    pos = torch.randint(0, 8192, (t,), device=device, generator=gen)
    q, k, v = randn(t, h, d), randn(t, hkv, d), randn(t, hkv, d)
    record(
        "rotary",
        torch.cat([y.flatten() for y in ops.rotary_embedding(pos, q, k, table, backend="triton")]),
        torch.cat([y.flatten() for y in reference.rotary_embedding(pos, q, k, table)]),
    )
    gu = randn(t, 2 * hidden)
    record("silu_and_mul", ops.silu_and_mul(gu, backend="triton"), reference.silu_and_mul(gu))
    for int8 in (False, True):
        blocks = 2 * (-(-t // bs)) + 1
        dtype = torch.int8 if int8 else f16
        caches = [torch.zeros(blocks, bs, hkv, d, dtype=dtype, device=device) for _ in range(4)]
        scales = [torch.zeros(blocks, bs, hkv, device=device) if int8 else None for _ in range(4)]
        slots = torch.randperm(blocks * bs, device=device, generator=gen)[:t]
        ops.write_kv(k, v, caches[0], caches[1], slots, scales[0], scales[1], backend="triton")
        reference.write_kv(k, v, caches[2], caches[3], slots, scales[2], scales[3])
        name = "write_kv int8" if int8 else "write_kv fp16"
        record(name, caches[0].float(), caches[2].float(), tol=1e-2 if int8 else 1e-6)
        # Prefill: two sequences, the second with a cached prefix of 5 tokens.
        ctx = [t // 2, t // 2 + 5]
        q_lens = [t // 2, t // 2]
        tables = torch.arange(2 * (-(-(t // 2 + 5) // bs)), device=device, dtype=torch.int32)
        tables = tables.view(2, -1) % blocks
        kc, vc = caches[0], caches[1]
        kc_scale, vc_scale = scales[0], scales[1]
        if not int8:
            kc.normal_(generator=gen)
            vc.normal_(generator=gen)
        else:
            assert kc_scale is not None and vc_scale is not None
            kc_scale.uniform_(0.001, 0.02, generator=gen)
            vc_scale.uniform_(0.001, 0.02, generator=gen)
        lens = torch.tensor(ctx, dtype=torch.int32, device=device)
        cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32, device=device)
        qp = randn(sum(q_lens), h, d)
        kw = {"k_scale": kc_scale, "v_scale": vc_scale}
        record(
            "prefill " + ("int8" if int8 else "fp16"),
            ops.paged_prefill_attention(
                qp, kc, vc, tables, cu, lens, d**-0.5, max(q_lens), backend="triton", **kw
            ),
            reference.paged_prefill_attention(qp, kc, vc, tables, cu, lens, d**-0.5, **kw),
        )
    return rows


def matmul_cases(smoke: bool) -> list[tuple[int, int, int]]:
    if smoke:
        return [(m, 256, 96) for m in (1, 8)]
    # (K, N): x[M, K] @ W[K, N]; the 8B layer shapes: o_proj, gate/up, down, fused q/k/v
    shapes = [(4096, 4096), (4096, 14336), (14336, 4096), (4096, 6144)]
    return [(m, k, n) for (k, n) in shapes for m in (1, 4, 8, 64)]


GEMLITE: tuple[Any, str] | None = None  # (module, config file) once loaded, on CUDA only


def bench_matmul(m: int, k: int, n: int, device: torch.device, smoke: bool) -> dict[str, Any]:
    from hydrant.kernels import ops, reference
    from hydrant.kernels.quantization.rtn import quantize_int4_groupwise, quantize_int8_per_channel

    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(m, k, dtype=torch.float16, device=device, generator=gen)
    w = torch.randn(n, k, dtype=torch.float16, device=device, generator=gen) * k**-0.5
    q8, s8 = quantize_int8_per_channel(w, torch.float16)
    q4, s4, z4 = quantize_int4_groupwise(w, 128 if k % 128 == 0 else 64, torch.float16)
    group = k // s4.shape[1]
    reps = 1 if smoke else 10
    variants: dict[str, tuple[int, Callable[[int], Callable[[], Any]]]] = {}
    fp16 = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2, smoke) - 1)]
    variants["fp16"] = (w.numel() * 2, lambda i: lambda: torch.matmul(x, fp16[i].t()))
    w8 = [(q8, s8)] + [(q8.clone(), s8.clone()) for _ in range(copies_for(q8.numel(), smoke) - 1)]
    variants["w8a16"] = (
        q8.numel() + s8.numel() * 2,
        lambda i: lambda: ops.w8a16_matmul(x, *w8[i], backend="triton"),
    )
    w4 = [(q4, s4, z4)] + [
        (q4.clone(), s4.clone(), z4.clone()) for _ in range(copies_for(q4.numel(), smoke) - 1)
    ]
    variants["w4a16"] = (
        q4.numel() + 4 * s4.numel(),
        lambda i: lambda: ops.w4a16_matmul(x, *w4[i], group, backend="triton"),
    )
    row: dict[str, Any] = {"m": m, "k": k, "n": n}
    row["w8a16_rel_err"] = rel_err(
        ops.w8a16_matmul(x, q8, s8, backend="triton"), reference.w8a16_matmul(x, q8, s8)
    )
    row["w4a16_rel_err"] = rel_err(
        ops.w4a16_matmul(x, q4, s4, z4, group, backend="triton"),
        reference.w4a16_matmul(x, q4, s4, z4, group),
    )
    copies = {"fp16": fp16, "w8a16": w8, "w4a16": w4}
    for name, (nbytes, make) in variants.items():
        calls = [make(i) for i in range(len(copies[name]))]
        seconds, mode = time_calls(calls, device, reps)
        row[f"{name}_us"] = seconds * 1e6
        row[f"{name}_weight_gbps"] = nbytes / seconds / 1e9
        row["timing"] = mode
    row["w8a16_speedup"] = row["fp16_us"] / row["w8a16_us"]
    row["w4a16_speedup"] = row["fp16_us"] / row["w4a16_us"]
    if GEMLITE is not None:
        import gpu_gemlite

        try:
            peers = gpu_gemlite.layers(q4, s4, z4, group, q8, s8, len(w4))
        except Exception as exc:  # a gemlite that cannot pack these: the row says so
            row["gemlite_error"] = f"{type(exc).__name__}: {exc}"
            peers = {"w4": [], "w8": []}
        row.update(
            gpu_gemlite.best(
                "w4", peers["w4"], x, reference.w4a16_matmul(x, q4, s4, z4, group), reps
            )
        )
        row.update(gpu_gemlite.best("w8", peers["w8"], x, reference.w8a16_matmul(x, q8, s8), reps))
        del peers
        if isinstance(row.get("gemlite_w4_us"), float):
            row["w4_vs_gemlite"] = row["gemlite_w4_us"] / row["w4a16_us"]
        if isinstance(row.get("gemlite_w8_us"), float):
            row["w8_vs_gemlite"] = row["gemlite_w8_us"] / row["w8a16_us"]
    # #29's targets: at M=1 W4A16 at least as fast as gemlite's best; at M=64 not slower
    # than float16 (where a GEMV stops paying, a tensor-core path must take over).
    if m == 1 and "w4_vs_gemlite" in row:
        row["pass"] = row["w4_vs_gemlite"] >= 1.0
    if m == 64:
        row["pass"] = row["w4a16_speedup"] >= 1.0
    return row


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    print(f"\n== {title}")
    print(" | ".join(f"{c:>14s}" for c in columns))
    for row in rows:
        cells = []
        for c in columns:
            value = row.get(c, "")
            if isinstance(value, float):
                cells.append(f"{value:14.2e}" if 0 < abs(value) < 0.01 else f"{value:14.3f}")
            else:
                cells.append(f"{value!s:>14s}")
        print(" | ".join(cells))


E2E_MODEL: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # ~1.2B parameters


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_e2e(device: torch.device, smoke: bool, quantized: bool = False) -> dict[str, Any]:
    """Decode tokens/s of transformers `generate` and of the Hydrant engine, batch 1 and 64.

    The engine runs with its decode CUDA graphs (the default) and then, if the
    deadline allows, with `enforce_eager`; `vs_eager` is what the graphs gain.
    With `quantized` it also runs with int8 and int4 weights (quantized at load),
    where batch 1 shows what the decode GEMV kernels buy end to end.
    """
    e2e_deadline = DEADLINE_S + (120.0 if quantized else 0.0)
    try:
        from hydrant.engine.engine_config import EngineConfig
        from hydrant.engine.llm_engine import LLMEngine
        from hydrant.engine.sampling_params import SamplingParams
    except ImportError as exc:
        log(f"e2e skipped: the engine API is not there ({exc})")
        return {"skipped": str(exc)}
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = torch.float16 if device.type == "cuda" else torch.float32
    prompt_len, new_tokens = (8, 4) if smoke else (128, 128)
    batches = (1, 2) if smoke else (1, 64)
    out: dict[str, Any] = {"prompt_len": prompt_len, "new_tokens": new_tokens, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        config = LlamaConfig(**(SMOKE_LLAMA if smoke else E2E_MODEL))
        with torch.device(device):  # random init on the GPU: seconds, not a minute
            model: Any = LlamaForCausalLM(config)
        model.to(dtype=dtype).eval()
        out["parameters"] = sum(p.numel() for p in model.parameters())
        log(f"e2e model: {out['parameters'] / 1e9:.2f}B parameters, saving to {tmp}")
        model.save_pretrained(tmp, safe_serialization=True)
        prompts = {
            b: torch.randint(0, config.vocab_size, (b, prompt_len), device=device) for b in batches
        }
        model.generate(prompts[1], max_new_tokens=2, do_sample=False, pad_token_id=0)
        for b in batches:
            _sync(device)
            started = time.perf_counter()
            model.generate(
                prompts[b],
                attention_mask=torch.ones_like(prompts[b]),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
            _sync(device)
            tps = b * new_tokens / (time.perf_counter() - started)
            out["rows"].append({"batch": b, "system": "transformers", "tokens_per_s": tps})
            log(f"transformers generate batch {b}: {tps:.1f} tokens/s")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        params = SamplingParams(
            max_tokens=new_tokens, min_tokens=new_tokens, temperature=0.0, ignore_eos=True
        )
        graphs_seconds = 0.0
        out["graph_replays"], out["engine_error"] = {}, {}
        engine: Any = None
        systems: list[tuple[str, bool, str | None]] = [
            ("hydrant", False, None),
            ("hydrant eager", True, None),
        ]
        if quantized:
            systems += [
                ("hydrant int8 weights", False, "int8"),
                ("hydrant int4 weights", False, "int4"),
            ]
        for system, eager, quantization in systems:
            if system != "hydrant" and time.perf_counter() - START + graphs_seconds > e2e_deadline:
                log(f"deadline near: the {system} engine run is skipped")
                break
            started_system = time.perf_counter()
            try:
                engine = LLMEngine.from_pretrained(
                    Path(tmp),
                    EngineConfig(
                        device=str(device),
                        dtype=str(dtype).split(".")[-1],
                        show_progress=False,
                        max_num_seqs=max(batches),
                        enforce_eager=eager,
                        quantization=quantization,
                    ),
                )
                out["rows"].extend(_engine_decode(engine, system, prompts, params, batches))
                replays = getattr(getattr(engine.runner, "decode_graphs", None), "replays", 0)
                out["graph_replays"][system] = replays
                log(f"{system}: {replays} decode steps replayed a CUDA graph")
            except Exception as exc:  # the engine is young: report, never crash the kernel bench
                log(f"e2e {system} part skipped: {type(exc).__name__}: {exc}")
                out["engine_error"][system] = f"{type(exc).__name__}: {exc}"
            engine = None
            gc.collect()  # the engine holds most of the GPU (its KV cache): free it for the next
            if device.type == "cuda":
                torch.cuda.empty_cache()
            if system == "hydrant":
                graphs_seconds = time.perf_counter() - started_system
    by_system = {(r["system"], r["batch"]): r["tokens_per_s"] for r in out["rows"]}
    for row in out["rows"]:
        eager_tps = by_system.get(("hydrant eager", row["batch"]))
        if row["system"] == "hydrant" and eager_tps:
            row["vs_eager"] = row["tokens_per_s"] / eager_tps
            log(f"batch {row['batch']}: CUDA graphs decode {row['vs_eager']:.2f}x eager")
    print_table(
        "end-to-end decode (prompt + new tokens, new tokens / wall time)",
        out["rows"],
        ["system", "batch", "tokens_per_s", "vs_eager"],
    )
    return out


def _engine_decode(
    engine: Any,
    system: str,
    prompts: dict[int, torch.Tensor],
    params: Any,
    batches: tuple[int, ...],
) -> list[dict[str, Any]]:
    """Tokens/s of one engine at each batch size; a first batch-1 pass warms it up."""
    from hydrant.engine.sequence import Request

    device = engine.runner.device
    rows = []
    for n, b in enumerate((1, *batches)):
        for i in range(b):
            engine.add_request(Request(f"{system}-{n}-{i}", prompts[b][i].tolist(), params))
        _sync(device)
        started = time.perf_counter()
        while engine.has_unfinished():
            engine.step()
        _sync(device)
        tps = b * params.max_tokens / (time.perf_counter() - started)
        if n > 0:
            rows.append({"batch": b, "system": system, "tokens_per_s": tps})
            log(f"{system} engine batch {b}: {tps:.1f} tokens/s")
    return rows


def run_sweeps(
    device: torch.device, smoke: bool, copy_gbps: float, results: dict[str, Any], which: str
) -> None:
    """`--tune`: time each candidate launch shape of the decode kernels (gpu_tuning.py)."""
    import gpu_tuning

    deadline = START + TUNE_DEADLINE_S
    results["tune_decode"], results["tune_gemv"] = [], []
    if which in ("all", "decode"):
        log("tuning sweep: decode attention tiles")
        results["tune_decode"] = gpu_tuning.sweep_decode(device, smoke, copy_gbps, deadline)
        print_table(
            "decode attention candidates (block_n/warps/stages)",
            results["tune_decode"],
            ["batch", "context", "kv", "config", "rel_err", "us", "share_of_copy", "error"],
        )
    if which in ("all", "gemv"):
        log("tuning sweep: GEMV shapes")
        results["tune_gemv"] = gpu_tuning.sweep_gemv(device, smoke, deadline)
        print_table(
            "GEMV candidates (block_n/block_k/warps/stages), speedup vs float16 torch.matmul",
            results["tune_gemv"],
            [
                "m",
                "k",
                "n",
                "config",
                "fp16_us",
                "w8_us",
                "w4_us",
                "w8_speedup",
                "w4_speedup",
                "w4_err",
                "error",
            ],
        )
    results["tune_winners"] = gpu_tuning.apply_winners(results["tune_decode"], results["tune_gemv"])
    log(f"sweep winners, used from here on: {results['tune_winners']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_kernels.json")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, CPU interpreter OK")
    parser.add_argument("--e2e", action="store_true", help="engine vs transformers decode")
    parser.add_argument(
        "--tune",
        nargs="?",
        const="all",
        choices=("all", "gemv", "decode"),
        help="sweep launch shapes of the decode GEMVs and/or decode attention (default: all)",
    )
    parser.add_argument(
        "--e2e-quant", action="store_true", help="--e2e, and the engine with int8/int4 weights"
    )
    parser.add_argument(
        "--no-attention", action="store_true", help="skip the decode attention bandwidth table"
    )
    parser.add_argument("--no-gemlite", action="store_true", help="skip the gemlite columns")
    parser.add_argument(
        "--deadline",
        type=float,
        default=DEADLINE_S,
        help="seconds after which no new matmul shape starts (the tables still print)",
    )
    args = parser.parse_args(argv)
    if torch.cuda.is_available() and not args.smoke:
        device = torch.device("cuda")
        log(f"device: {torch.cuda.get_device_name(device)}")
    elif args.smoke and os.environ.get("TRITON_INTERPRET") == "1":
        device = torch.device("cpu")
        log("smoke run on the CPU through the Triton interpreter (numbers are meaningless)")
    else:
        parser.error("needs CUDA, or --smoke with TRITON_INTERPRET=1 set before starting")
    results: dict[str, Any] = {"device": str(device), "smoke": args.smoke}
    log("correctness sweep: every op on Triton vs its reference")
    results["correctness"] = correctness_sweep(device, args.smoke)
    print_table(
        "correctness (relative error vs reference)",
        results["correctness"],
        ["op", "rel_err", "pass"],
    )
    copy = copy_bandwidth(device, args.smoke)
    results["copy"] = copy
    log(
        f"copy bandwidth {copy['gbps']:.0f} GB/s (memcpy {copy['memcpy_gbps']:.0f}, "
        f"copy kernel {copy['kernel_gbps']:.0f}; {copy['timing']})"
    )
    if args.tune:
        run_sweeps(device, args.smoke, copy["gbps"], results, args.tune)
    results["decode_attention"] = []
    for case in [] if args.no_attention else decode_cases(args.smoke):
        log(f"decode attention {case}")
        results["decode_attention"].append(bench_decode(case, device, copy["gbps"], args.smoke))
    print_table(
        "paged decode attention (KV bytes read / time, vs copy bandwidth)",
        results["decode_attention"],
        ["batch", "context", "kv", "rel_err", "us", "gbps", "share_of_copy", "pass"],
    )
    global GEMLITE
    if device.type == "cuda" and not args.no_gemlite:
        import gpu_gemlite

        GEMLITE = gpu_gemlite.load_gemlite()
        results["gemlite_config"] = GEMLITE[1] if GEMLITE else None
    results["matmul"] = []
    for m, k, n in matmul_cases(args.smoke):
        if time.perf_counter() - START > args.deadline:
            log("deadline reached: remaining matmul shapes skipped")
            break
        row = bench_matmul(m, k, n, device, args.smoke)
        results["matmul"].append(row)
        log(
            f"matmul M={m} K={k} N={n}: fp16 {row['fp16_us']:.1f} us, "
            f"w8a16 {row['w8a16_us']:.1f}, w4a16 {row['w4a16_us']:.1f}, "
            f"gemlite w8 {row.get('gemlite_w8_us', '-')}, w4 {row.get('gemlite_w4_us', '-')} "
            f"({row.get('gemlite_w4_kernel', '-')})"
        )
    print_table(
        "weight-only matmul vs float16 torch.matmul (speedup > 1 is faster)",
        results["matmul"],
        [
            "m",
            "k",
            "n",
            "fp16_us",
            "w8a16_us",
            "w4a16_us",
            "gemlite_w8_us",
            "gemlite_w4_us",
            "gemlite_w4_kernel",
            "w8a16_speedup",
            "w4a16_speedup",
            "w8_vs_gemlite",
            "w4_vs_gemlite",
            "w4a16_rel_err",
            "pass",
        ],
    )
    if args.e2e or args.e2e_quant:
        results["e2e"] = run_e2e(device, args.smoke, quantized=args.e2e_quant)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_kernels.json").write_text(json.dumps(results, indent=1, default=str))
    log(f"wrote {args.out / 'gpu_kernels.json'}")
    return results


if __name__ == "__main__":
    main()
