"""What the GPU bench scripts share: the clock and log, relative error, CUDA-graph timing,
L2-defeating operand copies, the copy-bandwidth baseline, and the paged-KV inputs of a
decode attention case.

`gpu_kernels.py` measures with these and `gpu_tuning.py` (its `--tune` sweeps) times
candidates the same way, so a sweep's numbers and the tables after it compare.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

START = time.perf_counter()
L2_DEFEAT_BYTES = 256 << 20
# The tiny Llama the `--smoke` runs build on the CPU (gpu_kernels.py's e2e, gpu_decode.py).
SMOKE_LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def log(message: str) -> None:
    print(f"[{time.perf_counter() - START:6.1f}s] {message}", flush=True)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out64, ref64 = out.double(), ref.double()
    return float((out64 - ref64).norm() / ref64.norm().clamp(min=1e-30))


def time_calls(
    calls: list[Callable[[], Any]], device: torch.device, reps: int
) -> tuple[float, str]:
    """Seconds per call, cycling through `calls` (one per operand copy)."""
    for fn in calls:
        fn()
    if device.type != "cuda":
        started = time.perf_counter()
        for _ in range(reps):
            for fn in calls:
                fn()
        return (time.perf_counter() - started) / (reps * len(calls)), "cpu"
    torch.cuda.synchronize()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for fn in calls:
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                for fn in calls:
                    fn()
        graph.replay()
        torch.cuda.synchronize()
        runner, mode = graph.replay, "graph"
        count = 1
    except Exception as exc:  # capture is an optimisation; eager timing still answers
        log(f"  graph capture failed ({type(exc).__name__}: {exc}); timing eagerly")

        def runner() -> None:
            for _ in range(reps):
                for fn in calls:
                    fn()

        mode, count = "eager", 1
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(count):
            runner()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / (reps * len(calls)))
    return sorted(samples)[len(samples) // 2], mode


def copies_for(nbytes: int, smoke: bool) -> int:
    return 1 if smoke else max(1, math.ceil(L2_DEFEAT_BYTES / max(nbytes, 1)))


def copy_bandwidth(device: torch.device, smoke: bool) -> dict[str, Any]:
    """Bytes read + written per second by the faster of a memcpy and an elementwise kernel.

    The first H200 run (2026-12-04) timed `copy_` alone inside a CUDA graph: a memcpy
    node there ran at 2.8 TB/s, below what the attention kernel itself reached, so
    the baseline now also times a vectorised copy kernel (`torch.mul(src, 1)`) and
    takes the faster; both are reported.
    """
    n = (1 << 16) if smoke else (1 << 30)
    src = torch.ones(n // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    reps = 3 if smoke else 20
    memcpy, mode = time_calls([lambda: dst.copy_(src)], device, reps=reps)
    kernel, _ = time_calls([lambda: torch.mul(src, 1.0, out=dst)], device, reps=reps)
    seconds = min(memcpy, kernel)
    return {
        "bytes": 2 * n,
        "seconds": seconds,
        "gbps": 2 * n / seconds / 1e9,
        "memcpy_gbps": 2 * n / memcpy / 1e9,
        "kernel_gbps": 2 * n / kernel / 1e9,
        "timing": mode,
    }


@dataclass
class DecodeInputs:
    """A decode attention case's operands: random K/V (int8 with scales, or float16) in
    blocks of 16 shuffled over the pool, one float16 query per sequence."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    tables: torch.Tensor
    lens: torch.Tensor
    scales: dict[str, torch.Tensor | None]
    kv_bytes: int  # what the kernel must read: K and V, with int8's float32 scales


def decode_inputs(
    batch: int,
    context: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    kv: str,
    device: torch.device,
) -> DecodeInputs:
    block = 16
    per_seq = math.ceil(context / block)
    gen = torch.Generator(device=device).manual_seed(0)
    shape = (batch * per_seq, block, kv_heads, head_dim)
    scales: dict[str, torch.Tensor | None] = {"k_scale": None, "v_scale": None}
    if kv == "int8":
        k = torch.randint(-127, 128, shape, dtype=torch.int8, device=device, generator=gen)
        v = torch.randint(-127, 128, shape, dtype=torch.int8, device=device, generator=gen)
        scales = {
            name: torch.rand(shape[:3], device=device, generator=gen) * 0.02
            for name in ("k_scale", "v_scale")
        }
    else:
        k = torch.randn(shape, dtype=torch.float16, device=device, generator=gen)
        v = torch.randn(shape, dtype=torch.float16, device=device, generator=gen)
    perm = torch.randperm(batch * per_seq, device=device, generator=gen)
    tables = perm.view(batch, per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    q = torch.randn(batch, heads, head_dim, dtype=torch.float16, device=device, generator=gen)
    kv_bytes = (
        2 * batch * context * kv_heads * (head_dim * k.element_size() + (4 if kv == "int8" else 0))
    )
    return DecodeInputs(q, k, v, tables, lens, scales, kv_bytes)
