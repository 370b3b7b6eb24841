"""Compile each Triton kernel for Hopper (sm_90) on a machine without a GPU.

The interpreter accepts code the GPU compiler rejects (a `tl.dot` shape, a
dtype mix, a scalar-vs-block op), so this runs Triton's whole pipeline,
TTIR -> TTGIR -> LLVM -> PTX -> ptxas cubin, for one representative
specialisation of every kernel, with the 16-byte divisibility hints the JIT
gives aligned tensors and Llama-sized strides, and fails a kernel that spills
registers to the stack (read from the cubin with Triton's bundled cuobjdump).
Run as a script with TRITON_INTERPRET unset (the kernel tests set it, hence the
subprocess in test_kernel_gpu_compile.py); prints one line per kernel and
exits non-zero if any fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("run with TRITON_INTERPRET unset: the interpreter replaces @triton.jit")

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.compiler import compile as compile_kernel

from hydrant.kernels import activation, kv_write, lora, quant_gemv, quant_matmul, rms_norm, rotary
from hydrant.kernels import decode_attention as decode
from hydrant.kernels import prefill_attention as prefill

HOPPER = GPUTarget("cuda", 90, 32)
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
# Integer arguments that are multiples of 16 at Llama sizes (head_dim 128, hidden 4096, ...).
DIVISIBLE = {
    "head_dim",
    "hidden",
    "inter",
    "K",
    "N",
    "k_per_split",
    "group_size",
    "num_groups",
    "tokens_per_split",
    "block_size",
}
F16, CMP = tl.float16, {"COMPUTE": tl.float16, "PRECISION": "tf32"}


def attention_types(quantized: bool, extra: dict[str, str]) -> dict[str, str]:
    cache = "*i8" if quantized else "*fp16"
    scale = "*fp32" if quantized else "*i32"
    return {
        "q_ptr": "*fp16",
        "k_cache_ptr": cache,
        "v_cache_ptr": cache,
        "k_scale_ptr": scale,
        "v_scale_ptr": scale,
        "block_tables_ptr": "*i32",
        "context_lens_ptr": "*i32",
        "out_ptr": "*fp16",
        "scale_log2": "fp32",
        **extra,
    }


CASES: list[tuple[str, Any, dict[str, str], dict[str, Any], int]] = [
    (
        "write_kv int8",
        kv_write._write_kv_kernel,
        {
            "key_ptr": "*bf16",
            "value_ptr": "*bf16",
            "k_cache_ptr": "*i8",
            "v_cache_ptr": "*i8",
            "k_scale_ptr": "*fp32",
            "v_scale_ptr": "*fp32",
            "slot_ptr": "*i64",
        },
        {"QUANTIZED": True, "BLOCK_H": 8, "BLOCK_D": 128},
        4,
    ),
    (
        "decode fp16 split",
        decode._decode_kernel,
        attention_types(False, {"part_acc_ptr": "*fp32", "part_stats_ptr": "*fp32"}),
        {
            "GROUP": 4,
            "BLOCK_G": 16,
            "BLOCK_N": 64,
            "BLOCK_D": 128,
            "QUANTIZED": False,
            "SPLIT": True,
            **CMP,
        },
        4,
    ),
    (
        "decode int8",
        decode._decode_kernel,
        attention_types(True, {"part_acc_ptr": "*fp16", "part_stats_ptr": "*fp16"}),
        {
            "GROUP": 8,
            "BLOCK_G": 16,
            "BLOCK_N": 64,
            "BLOCK_D": 128,
            "QUANTIZED": True,
            "SPLIT": False,
            **CMP,
        },
        4,
    ),
    (
        "decode combine",
        decode._combine_kernel,
        {"part_acc_ptr": "*fp32", "part_stats_ptr": "*fp32", "out_ptr": "*fp16"},
        {"BLOCK_S": 128, "CHUNK": 16, "BLOCK_D": 128},
        4,
    ),
    (
        "prefill int8 gqa4",
        prefill._prefill_kernel,
        attention_types(True, {"cu_seqlens_ptr": "*i32"}),
        {
            "GROUP": 4,
            "GROUP_PAD": 4,
            "BLOCK_R": 64,
            "BLOCK_N": 64,
            "BLOCK_D": 128,
            "QUANTIZED": True,
            **CMP,
        },
        8,
    ),
    (
        "rms_norm residual",
        rms_norm._rms_norm_kernel,
        {
            "x_ptr": "*fp16",
            "residual_ptr": "*fp16",
            "weight_ptr": "*fp16",
            "out_ptr": "*fp16",
            "new_residual_ptr": "*fp16",
            "eps": "fp32",
        },
        {"HAS_RESIDUAL": True, "BLOCK": 4096},
        8,
    ),
    (
        "rotary",
        rotary._rotary_kernel,
        {
            "positions_ptr": "*i64",
            "q_ptr": "*fp16",
            "k_ptr": "*fp16",
            "cache_ptr": "*fp16",
            "q_out_ptr": "*fp16",
            "k_out_ptr": "*fp16",
        },
        {"BLOCK_H": 32, "BLOCK_KH": 8, "BLOCK_HALF": 64},
        4,
    ),
    (
        "silu_and_mul",
        activation._silu_and_mul_kernel,
        {"x_ptr": "*bf16", "out_ptr": "*bf16"},
        {"BLOCK": 1024},
        4,
    ),
    (
        "w8a16 decode tiles",
        quant_matmul._w8a16_kernel,
        {"x_ptr": "*fp16", "w_ptr": "*i8", "scales_ptr": "*fp16", "out_ptr": "*fp32"},
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, **CMP},
        4,
    ),
    (
        "w4a16 decode tiles",
        quant_matmul._w4a16_kernel,
        {
            "x_ptr": "*fp16",
            "w_ptr": "*u8",
            "scales_ptr": "*fp16",
            "zeros_ptr": "*fp16",
            "out_ptr": "*fp32",
        },
        {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, **CMP},
        4,
    ),
    (
        "w4a16 prefill tiles",
        quant_matmul._w4a16_kernel,
        {
            "x_ptr": "*bf16",
            "w_ptr": "*u8",
            "scales_ptr": "*bf16",
            "zeros_ptr": "*u8",
            "out_ptr": "*bf16",
        },
        {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "COMPUTE": tl.bfloat16, "PRECISION": "tf32"},
        8,
    ),
    (
        "w8a16 gemv",
        quant_gemv._w8a16_gemv_kernel,
        {"x_ptr": "*fp16", "w_ptr": "*i8", "scales_ptr": "*fp16", "out_ptr": "*fp16"},
        {
            "BLOCK_N": quant_gemv.W8A16_GEMV.block_n,
            "BLOCK_K": quant_gemv.W8A16_GEMV.block_k,
            "FAST_CONVERT": True,
        },
        quant_gemv.W8A16_GEMV.num_warps,
    ),
    (
        "w4a16 gemv",
        quant_gemv._w4a16_gemv_kernel,
        {
            "x_ptr": "*bf16",
            "w_ptr": "*u8",
            "scales_ptr": "*bf16",
            "zeros_ptr": "*u8",
            "out_ptr": "*bf16",
        },
        {
            "BLOCK_N": quant_gemv.W4A16_GEMV.block_n,
            "GROUPS": quant_gemv.W4A16_GEMV.block_k // 128,
            "GROUP_BYTES": 64,
            "FAST_CONVERT": True,
        },
        quant_gemv.W4A16_GEMV.num_warps,
    ),
    (
        "lora bgmv shrink",
        lora._bgmv_shrink_kernel,
        {"x_ptr": "*fp16", "a_ptr": "*fp16", "slots_ptr": "*i32", "mid_ptr": "*fp32"},
        {"BLOCK_R": 16, "BLOCK_K": lora.BLOCK_K},
        4,
    ),
    (
        "lora bgmv expand",
        lora._bgmv_expand_kernel,
        {
            "mid_ptr": "*fp32",
            "b_ptr": "*fp16",
            "scales_ptr": "*fp32",
            "slots_ptr": "*i32",
            "y_ptr": "*fp16",
        },
        {"BLOCK_R": 16, "BLOCK_N": lora.BLOCK_N},
        4,
    ),
    (
        "lora sgmv shrink",
        lora._sgmv_shrink_kernel,
        {
            "x_ptr": "*bf16",
            "a_ptr": "*bf16",
            "starts_ptr": "*i32",
            "seg_slots_ptr": "*i32",
            "mid_ptr": "*fp32",
        },
        {
            "BLOCK_M": lora.BLOCK_M,
            "BLOCK_R": 64,
            "BLOCK_K": lora.BLOCK_K,
            "COMPUTE": tl.bfloat16,
            "PRECISION": "tf32",
        },
        4,
    ),
    (
        "lora sgmv expand",
        lora._sgmv_expand_kernel,
        {
            "mid_ptr": "*fp32",
            "b_ptr": "*bf16",
            "scales_ptr": "*fp32",
            "starts_ptr": "*i32",
            "seg_slots_ptr": "*i32",
            "y_ptr": "*bf16",
        },
        {
            "BLOCK_M": lora.BLOCK_M,
            "BLOCK_R": 64,
            "BLOCK_N": lora.BLOCK_N,
            "COMPUTE": tl.bfloat16,
            "PRECISION": "tf32",
        },
        4,
    ),
]


def resource_usage(cubin: bytes) -> tuple[int, int] | None:
    """(registers, stack bytes) of the cubin's kernel, or None without cuobjdump."""
    if not CUOBJDUMP.is_file():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run(
            [str(CUOBJDUMP), "--dump-resource-usage", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
    found = re.search(r"REG:(\d+) STACK:(\d+)", done.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def compile_case(fn: Any, pointers: dict[str, str], constexprs: dict[str, Any], warps: int) -> Any:
    # Every argument not listed is a plain int32 scalar (sizes, strides).
    signature = {
        arg: "constexpr" if arg in constexprs else pointers.get(arg, "i32") for arg in fn.arg_names
    }
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, arg in enumerate(fn.arg_names)
        if arg not in constexprs
        and (signature[arg].startswith("*") or arg.startswith("stride") or arg in DIVISIBLE)
    }
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return compile_kernel(source, target=HOPPER, options={"num_warps": warps})


def main() -> int:
    failed = 0
    for name, fn, pointers, constexprs, warps in CASES:
        try:
            kernel = compile_case(fn, pointers, constexprs, warps)
        except Exception as exc:  # report every kernel, then fail once
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}")
            continue
        usage = resource_usage(kernel.asm["cubin"])
        if usage is not None and usage[1] > 0:
            failed += 1
            print(f"FAIL {name}: spills {usage[1]} bytes to the stack ({usage[0]} registers)")
            continue
        regs = f"{usage[0]} registers" if usage else "registers unknown"
        print(f"ok   {name} ({regs}, shared memory {kernel.metadata.shared} B)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
