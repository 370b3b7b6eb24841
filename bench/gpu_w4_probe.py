# mypy: disable-error-code="no-untyped-def"
"""Where the W4A16 decode GEMV's time goes, on a GPU: the kernel with parts taken out.

`quant_gemv._w4a16_gemv_kernel` is copied here with switches, each removing
(or moving) one part of its work, and timed beside the product kernel and a
plain streaming read of the same bytes at M=1 on Llama-8B shapes:

- `prefetch_sz`: scales and zero points load one step ahead, like the weights
  (on an H200 this saved a fifth of the time of a word-layout variant of this
  kernel, where loading them in the step they serve cost ~2 us of 10);
- `no_x`: the activations are constants (no activation loads, no shared-memory
  layout conversion of them);
- `no_scale`: scales and zero points are constants (no loads);
- `load_only`: the bytes are loaded and summed as floats (no nibble work).

A part whose removal saves most of the time is the one to work on. The
variants that remove work compute something else on purpose and are not
checked; `full` and `prefetch_sz` still compute the product and carry their
relative error against the reference. The device's own TTGIR and PTX of
each full variant are written beside the JSON.

    python bench/gpu_w4_probe.py --out DIR   (CPU: TRITON_INTERPRET=1, tiny shapes)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import copies_for, log, rel_err, time_calls

from hydrant.kernels import quant_gemv, reference
from hydrant.kernels.quantization.rtn import quantize_int4_groupwise

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]  # (K, N)
COMPILED: dict[Any, Any] = {}
EXACT_VARIANTS = ("full", "prefetch_sz")
CONFIGS = [(16, 512, 4), (8, 512, 4), (8, 1024, 4), (32, 512, 8)]  # (block_n, block_k, warps)


@triton.jit
def _probe_kernel(
    x_ptr,
    w_ptr,
    scales_ptr,
    zeros_ptr,
    out_ptr,
    N,
    num_groups,
    stride_wn,
    stride_sn,
    stride_zn,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
    GROUP_BYTES: tl.constexpr,
    NO_X: tl.constexpr,
    NO_SCALE: tl.constexpr,
    LOAD_ONLY: tl.constexpr,
    PREFETCH_SZ: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < N
    g_offs = tl.arange(0, GROUPS)
    j = tl.arange(0, GROUP_BYTES)
    w_rows = w_ptr + rn.to(tl.int64)[:, None, None] * stride_wn
    acc = tl.zeros([BLOCK_N, GROUPS, GROUP_BYTES], tl.float32)
    kb = g_offs[:, None] * GROUP_BYTES + j[None, :]
    packed_next = tl.load(
        w_rows + kb[None, :, :],
        mask=n_mask[:, None, None] & (g_offs < num_groups)[None, :, None],
        other=0,
    )
    if PREFETCH_SZ:
        sz_mask0 = n_mask[:, None] & (g_offs < num_groups)[None, :]
        scale_next = tl.load(
            scales_ptr + rn[:, None] * stride_sn + g_offs[None, :], mask=sz_mask0, other=0.0
        )
        zero_next = tl.load(
            zeros_ptr + rn[:, None] * stride_zn + g_offs[None, :], mask=sz_mask0, other=0
        )
    for g0 in range(0, num_groups, GROUPS):
        packed = packed_next.to(tl.int32)
        g_next = g0 + GROUPS + g_offs
        kb_next = g_next[:, None] * GROUP_BYTES + j[None, :]
        packed_next = tl.load(
            w_rows + kb_next[None, :, :],
            mask=n_mask[:, None, None] & (g_next < num_groups)[None, :, None],
            other=0,
        )
        g = g0 + g_offs
        g_mask = g < num_groups
        if LOAD_ONLY:
            acc += packed.to(tl.float32)
        else:
            kb = g[:, None] * GROUP_BYTES + j[None, :]
            if NO_X:
                x_even = tl.full([GROUPS, GROUP_BYTES], 0.5, tl.float32)
                x_odd = tl.full([GROUPS, GROUP_BYTES], 1.5, tl.float32)
            else:
                x_even = tl.load(x_ptr + 2 * kb, mask=g_mask[:, None], other=0.0).to(tl.float32)
                x_odd = tl.load(x_ptr + 2 * kb + 1, mask=g_mask[:, None], other=0.0).to(tl.float32)
            if NO_SCALE:
                scale = tl.full([BLOCK_N, GROUPS], 1.0, tl.float32)
                zero = tl.full([BLOCK_N, GROUPS], 8.0, tl.float32)
            elif PREFETCH_SZ:
                scale, zero = scale_next.to(tl.float32), zero_next.to(tl.float32)
                sz_next = n_mask[:, None] & (g_next < num_groups)[None, :]
                scale_next = tl.load(
                    scales_ptr + rn[:, None] * stride_sn + g_next[None, :], mask=sz_next, other=0.0
                )
                zero_next = tl.load(
                    zeros_ptr + rn[:, None] * stride_zn + g_next[None, :], mask=sz_next, other=0
                )
            else:
                sz_mask = n_mask[:, None] & g_mask[None, :]
                scale = tl.load(
                    scales_ptr + rn[:, None] * stride_sn + g[None, :], mask=sz_mask, other=0.0
                ).to(tl.float32)
                zero = tl.load(
                    zeros_ptr + rn[:, None] * stride_zn + g[None, :], mask=sz_mask, other=0
                ).to(tl.float32)
            scale3 = scale[:, :, None]
            zero_scaled3 = zero[:, :, None] * scale3
            lo = quant_gemv._nibble_to_float(packed & 0xF, True) * scale3 - zero_scaled3
            hi = quant_gemv._nibble_to_float(packed >> 4, True) * scale3 - zero_scaled3
            acc += lo * x_even[None, :, :] + hi * x_odd[None, :, :]
    out = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptr + rn, out.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _stream_kernel(w_ptr, out_ptr, total, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Read `STEPS * BLOCK` contiguous words per program and write one sum: the floor."""
    base = tl.program_id(0).to(tl.int64) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(STEPS):
        offs = base + s * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(w_ptr + offs, mask=offs < total, other=0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def probe(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    z: torch.Tensor,
    config: tuple[int, int, int],
    flags: dict[str, bool],
) -> torch.Tensor:
    bn, bk, warps = config
    n = q.shape[0]
    out = torch.empty(n, dtype=x.dtype, device=x.device)
    COMPILED[(config, tuple(sorted(flags)))] = _probe_kernel[(triton.cdiv(n, bn),)](
        x,
        q,
        s,
        z,
        out,
        n,
        s.shape[1],
        q.stride(0),
        s.stride(0),
        z.stride(0),
        BLOCK_N=bn,
        GROUPS=max(1, bk // 128),
        GROUP_BYTES=64,
        NO_X=flags.get("no_x", False),
        NO_SCALE=flags.get("no_scale", False),
        LOAD_ONLY=flags.get("load_only", False),
        PREFETCH_SZ=flags.get("prefetch_sz", False),
        num_warps=warps,
    )
    return out


def stream(q: torch.Tensor) -> torch.Tensor:
    block, steps = 1024, 4
    total = q.numel()
    programs = triton.cdiv(total, block * steps)
    out = torch.empty(programs, dtype=torch.float32, device=q.device)
    _stream_kernel[(programs,)](q, out, total, BLOCK=block, STEPS=steps, num_warps=4)
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")  # CPU: TRITON_INTERPRET=1, tiny shapes
    # On the CPU: 5 groups in steps of 2 and 4, so prefetches, masked tails and the
    # loop-carried scales are all exercised.
    shapes, configs = (SHAPES, CONFIGS) if cuda else ([(640, 48)], [(16, 256, 4), (8, 512, 4)])
    rows: list[dict[str, Any]] = []
    variants = {
        "full": {},
        "no_x": {"no_x": True},
        "prefetch_sz": {"prefetch_sz": True},
        "no_scale": {"no_scale": True},
        "no_x+no_scale": {"no_x": True, "no_scale": True},
        "load_only": {"load_only": True},
    }
    for k, n in shapes:
        gen = torch.Generator(device=device).manual_seed(0)
        w = torch.randn(n, k, dtype=torch.float16, device=device, generator=gen) * k**-0.5
        q, s, z = quantize_int4_groupwise(w, 128, torch.float16)
        nbytes = q.numel() + 4 * s.numel()
        ops = [(q, s, z)] + [
            (q.clone(), s.clone(), z.clone()) for _ in range(copies_for(nbytes, not cuda) - 1)
        ]
        x = torch.randn(1, k, dtype=torch.float16, device=device, generator=gen)
        fp16 = [w] + [w.clone() for _ in range(copies_for(w.numel() * 2, not cuda) - 1)]
        base, _ = time_calls([functools.partial(torch.matmul, x, v.t()) for v in fp16], device, 10)
        floor, _ = time_calls([functools.partial(stream, a[0]) for a in ops], device, 10)
        product, _ = time_calls(
            [functools.partial(quant_gemv.w4a16_gemv, x, *a, 128) for a in ops], device, 10
        )
        log(
            f"K={k} N={n}: fp16 {base * 1e6:.2f} us, stream {floor * 1e6:.2f}, "
            f"gemv {product * 1e6:.2f}"
        )
        expected = reference.w4a16_matmul(x, q, s, z, 128)[0]
        head = {"k": k, "n": n, "fp16_us": base * 1e6, "stream_us": floor * 1e6}
        rows.append({**head, "config": "product", "variant": "full", "us": product * 1e6})
        for config in configs:
            name = "/".join(str(v) for v in config)
            for variant, flags in variants.items():
                try:
                    seconds, _ = time_calls(
                        [functools.partial(probe, x, *a, config, flags) for a in ops], device, 10
                    )
                except Exception as exc:  # a variant that fails to build is reported, not fatal
                    rows.append(
                        {**head, "config": name, "variant": variant, "error": str(exc)[:80]}
                    )
                    continue
                row = {**head, "config": name, "variant": variant, "us": seconds * 1e6}
                if variant in EXACT_VARIANTS:  # these still compute the product
                    row["rel_err"] = rel_err(probe(x, q, s, z, config, flags), expected)
                rows.append(row)
    print(
        f"{'k':>6} {'n':>6} {'config':>14} {'variant':>14} {'us':>8} {'x fp16':>7}"
        f" {'stream_us':>9} {'rel_err':>9}"
    )
    for r in rows:
        us = r.get("us")
        ratio = f"{r['fp16_us'] / us:7.2f}" if us else "      -"
        text = f"{us:8.2f}" if us else r.get("error", "")
        print(
            f"{r['k']:>6} {r['n']:>6} {r['config']:>14} {r['variant']:>14} {text:>8} {ratio}"
            f" {r['stream_us']:9.2f} {r.get('rel_err', float('nan')):9.2e}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_w4_probe.json").write_text(json.dumps(rows, indent=1))
    for (config, flags), compiled in COMPILED.items():
        if flags or not hasattr(compiled, "asm"):
            continue  # the device's own compile of each full kernel, for reading its loop
        name = "_".join(str(int(v)) for v in config)
        ttgir = compiled.asm.get("ttgir", "")
        loop = ttgir[ttgir.find("scf.for") : ttgir.find("scf.yield")]
        log(f"{name}: {loop.count('convert_layout')} layout conversions in the loop")
        (args.out / f"probe_{name}.ttgir").write_text(ttgir)
        (args.out / f"probe_{name}.ptx").write_text(compiled.asm.get("ptx", ""))
    return rows


if __name__ == "__main__":
    main()
