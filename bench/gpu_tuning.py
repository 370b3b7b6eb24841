"""Launch-shape sweeps for `bench/gpu_kernels.py --tune`: decode GEMV and decode attention.

Device time comes a few minutes at a time, so the shapes of the decode kernels
are chosen from one run that times a short list of candidates side by side
(each against the same float16 baseline, each checked against its
reference) instead of by an autotuner at start. The winners are written into
`quant_gemv.W8A16_GEMV` / `W4A16_GEMV` and `decode_attention.DECODE_TILES`
by hand, with the table that chose them in the session's note.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_common import copies_for, decode_inputs, rel_err, time_calls

# The GEMV loads go straight to registers (no shared-memory pipeline), so num_stages
# changes nothing there; occupancy and bytes per loop step are what vary. None of these
# spills on sm_90 (compiled without a GPU).
GEMV_CANDIDATES = [  # (block_n, block_k, num_warps, num_stages, fast_convert)
    (8, 1024, 4, 3, False),  # the first sweep's best, with prefetch but the slow conversion
    (4, 512, 2, 3, True),
    (4, 1024, 4, 3, True),
    (8, 512, 4, 3, True),
    (8, 1024, 4, 3, True),
    (8, 2048, 8, 3, True),
    (16, 512, 4, 3, True),
    (16, 1024, 8, 3, True),
    (32, 512, 8, 3, True),
]
DECODE_CANDIDATES = [  # (block_n, num_warps, num_stages); the first H200 sweep kept these
    (64, 4, 3),
    (64, 4, 2),
    (128, 4, 2),
    (128, 4, 3),
    (256, 4, 3),
    (32, 2, 3),
]
# Tiled (tensor-core) kernel shapes for decode without a K split: their weight loads feed
# tl.dot, so Triton pipelines them num_stages deep, which the GEMV loads are not.
TILED_CANDIDATES = [  # (block_m, block_n, block_k, split_k, num_warps, num_stages)
    (16, 16, 128, 1, 4, 4),
    (16, 16, 128, 1, 4, 6),
    (16, 32, 128, 1, 4, 4),
    (16, 32, 128, 1, 4, 6),
    (16, 64, 128, 1, 4, 5),
    (16, 32, 128, 2, 4, 5),
]
GEMV_SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]  # (K, N), Llama-8B layers
GEMV_ROWS = (1, 2, 4)


def sweep_gemv(device: torch.device, smoke: bool, deadline: float) -> list[dict[str, Any]]:
    """Each candidate shape of both GEMV kernels at every (K, N) and M, vs float16 matmul."""
    from hydrant.kernels import quant_gemv, quant_matmul, reference
    from hydrant.kernels.matmul_config import MatmulConfig, matmul_config
    from hydrant.kernels.quantization.rtn import quantize_int4_groupwise, quantize_int8_per_channel

    rows: list[dict[str, Any]] = []
    candidates = GEMV_CANDIDATES[:2] if smoke else GEMV_CANDIDATES
    for k, n in [(256, 96)] if smoke else GEMV_SHAPES:
        gen = torch.Generator(device=device).manual_seed(0)
        w = torch.randn(n, k, dtype=torch.float16, device=device, generator=gen) * k**-0.5
        q8, s8 = quantize_int8_per_channel(w, torch.float16)
        q4, s4, z4 = quantize_int4_groupwise(w, 128, torch.float16)
        fp16 = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2, smoke) - 1)]
        w8 = [(q8, s8)] + [
            (q8.clone(), s8.clone()) for _ in range(copies_for(q8.numel(), smoke) - 1)
        ]
        w4 = [(q4, s4, z4)] + [
            (q4.clone(), s4.clone(), z4.clone()) for _ in range(copies_for(q4.numel(), smoke) - 1)
        ]
        for m in (1,) if smoke else GEMV_ROWS:
            if time.perf_counter() > deadline:
                return rows
            x = torch.randn(m, k, dtype=torch.float16, device=device, generator=gen)
            reps = 1 if smoke else 10
            base, _ = time_calls(
                [functools.partial(torch.matmul, x, w.t()) for w in fp16], device, reps
            )
            ref8 = reference.w8a16_matmul(x, q8, s8)
            ref4 = reference.w4a16_matmul(x, q4, s4, z4, 128)
            tiled = matmul_config(m, n, k, device, max_block_k=128)
            launchers: list[tuple[str, Callable[..., torch.Tensor], Callable[..., torch.Tensor]]]
            launchers = [
                (
                    "tiled",
                    functools.partial(quant_matmul.w8a16_matmul, config=tiled),
                    functools.partial(quant_matmul.w4a16_matmul, config=tiled),
                )
            ]
            for tile in TILED_CANDIDATES[:1] if smoke else TILED_CANDIDATES:
                config = MatmulConfig(*tile)
                launchers.append(
                    (
                        "tiled:" + "/".join(str(v) for v in tile),
                        functools.partial(quant_matmul.w8a16_matmul, config=config),
                        functools.partial(quant_matmul.w4a16_matmul, config=config),
                    )
                )
            for bn, bk, warps, stages, fast in candidates:
                config = quant_gemv.GemvConfig(bn, bk, warps, stages, fast)
                launchers.append(
                    (
                        f"{bn}/{bk}/{warps}/{stages}" + ("" if fast else "/slow"),
                        functools.partial(quant_gemv.w8a16_gemv, config=config),
                        functools.partial(quant_gemv.w4a16_gemv, config=config),
                    )
                )
            for name, w8a16, w4a16 in launchers:
                row: dict[str, Any] = {"m": m, "k": k, "n": n, "config": name}
                row["fp16_us"] = base * 1e6
                try:
                    row["w8_err"] = rel_err(w8a16(x, q8, s8), ref8)
                    t8, _ = time_calls([functools.partial(w8a16, x, *a) for a in w8], device, reps)
                    row["w4_err"] = rel_err(w4a16(x, q4, s4, z4, 128), ref4)
                    t4, _ = time_calls(
                        [functools.partial(w4a16, x, *a, 128) for a in w4], device, reps
                    )
                except Exception as exc:  # a candidate that does not compile is a result too
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
                    rows.append(row)
                    continue
                row.update(
                    w8_us=t8 * 1e6, w4_us=t4 * 1e6, w8_speedup=base / t8, w4_speedup=base / t4
                )
                rows.append(row)
    return rows


def sweep_decode(
    device: torch.device, smoke: bool, copy_gbps: float, deadline: float
) -> list[dict[str, Any]]:
    """Each candidate decode tile, float16 and int8 caches, at two Llama-8B decode shapes."""
    from hydrant.kernels import decode_attention, reference

    rows: list[dict[str, Any]] = []
    h, hkv, d = (8, 2, 64) if smoke else (32, 8, 128)
    candidates = DECODE_CANDIDATES[:2] if smoke else DECODE_CANDIDATES
    for b, ctx in ((2, 40),) if smoke else ((64, 2048), (1, 32768)):
        for kv in ("float16", "int8"):
            inputs = decode_inputs(b, ctx, h, hkv, d, kv, device)
            operands = (inputs.q, inputs.k, inputs.v, inputs.tables, inputs.lens, d**-0.5)
            ref = reference.paged_decode_attention(*operands, **inputs.scales)
            for bn, warps, stages in candidates:
                if time.perf_counter() > deadline:
                    return rows
                row: dict[str, Any] = {"batch": b, "context": ctx, "kv": kv}
                row["config"] = f"{bn}/{warps}/{stages}"

                run = functools.partial(
                    decode_attention.paged_decode_attention,
                    *operands,
                    block_n=bn,
                    num_warps=warps,
                    num_stages=stages,
                    **inputs.scales,
                )
                try:
                    row["rel_err"] = rel_err(run(), ref)
                    seconds, _ = time_calls([run], device, 1 if smoke else 20)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:80]}"
                    rows.append(row)
                    continue
                row.update(
                    us=seconds * 1e6, share_of_copy=inputs.kv_bytes / seconds / 1e9 / copy_gbps
                )
                rows.append(row)
    return rows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def apply_winners(
    decode_rows: list[dict[str, Any]], gemv_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    """Make the sweep's fastest shapes the ones this process launches, and say which.

    Decode tiles: per cache dtype, the best geometric mean of share of copy bandwidth
    over the swept shapes. GEMV shapes: per kernel, the best geometric-mean speedup at
    M=1. `GEMV_MAX_M`: the largest swept M at which both GEMVs (at the chosen shapes)
    still beat the tiled kernel on every (K, N). The tables after `--tune` then measure
    these choices, which are copied into the source by hand.
    """
    from hydrant.kernels import decode_attention, matmul_config, quant_gemv

    winners: dict[str, Any] = {}
    for kv in ("float16", "int8"):
        scores: dict[str, list[float]] = {}
        for row in decode_rows:
            if row["kv"] == kv and "share_of_copy" in row:
                scores.setdefault(row["config"], []).append(row["share_of_copy"])
        if scores:
            best = max(scores, key=lambda c: _geomean(scores[c]))
            bn, warps, stages = (int(v) for v in best.split("/"))
            decode_attention.DECODE_TILES[kv == "int8"] = decode_attention.DecodeTile(
                bn, warps, stages
            )
            winners[f"decode {kv}"] = best
    # Small-M weight-only matmul: the best geometric-mean speedup at M=1 over both kernels
    # and every (K, N), among the GEMV shapes and the unsplit tiles ("tiled" is the
    # current heuristic). GEMV shapes are chosen per kernel; a tile, for both at once.
    speedups: dict[str, list[float]] = {}
    for row in gemv_rows:
        if row["m"] == 1 and "w8_speedup" in row:
            speedups.setdefault(row["config"], []).extend([row["w8_speedup"], row["w4_speedup"]])
    if speedups:
        best = max(speedups, key=lambda c: _geomean(speedups[c]))
        winners["small-M matmul"] = best
        if best.startswith("tiled:"):
            matmul_config.DECODE_TILE = matmul_config.MatmulConfig(
                *(int(v) for v in best.removeprefix("tiled:").split("/"))
            )
            quant_gemv.GEMV_MAX_M = 0
        elif best == "tiled":
            quant_gemv.GEMV_MAX_M = 0
        else:
            _choose_gemv(gemv_rows, winners)
    return winners


def _choose_gemv(gemv_rows: list[dict[str, Any]], winners: dict[str, Any]) -> None:
    """Per GEMV kernel its best shape at M=1; then the largest swept M at which both
    GEMVs still beat the current tiled heuristic on every (K, N)."""
    from hydrant.kernels import quant_gemv

    chosen: dict[str, str] = {}
    for kind in ("w8", "w4"):
        speedups: dict[str, list[float]] = {}
        for row in gemv_rows:
            if row["m"] == 1 and not row["config"].startswith("tiled") and f"{kind}_speedup" in row:
                speedups.setdefault(row["config"], []).append(row[f"{kind}_speedup"])
        chosen[kind] = max(speedups, key=lambda c: _geomean(speedups[c]))
        fields = chosen[kind].split("/")
        config = quant_gemv.GemvConfig(*(int(v) for v in fields[:4]), len(fields) == 4)
        setattr(quant_gemv, "W8A16_GEMV" if kind == "w8" else "W4A16_GEMV", config)
        winners[f"{kind}a16 gemv"] = chosen[kind]
    us = {
        (r["m"], r["k"], r["n"], r["config"], kind): r.get(f"{kind}_us")
        for r in gemv_rows
        for kind in ("w8", "w4")
    }
    max_m = 0
    for m in sorted({r["m"] for r in gemv_rows}):
        wins = [
            (us.get((m, key[1], key[2], chosen[key[4]], key[4])) or math.inf)
            < (us[key] or math.inf)
            for key in us
            if key[0] == m and key[3] == "tiled"
        ]
        if not wins or not all(wins):
            break
        max_m = m
    quant_gemv.GEMV_MAX_M = max_m
    winners["GEMV_MAX_M"] = max_m
