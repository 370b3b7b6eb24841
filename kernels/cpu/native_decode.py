"""The `cpu` backend's C kernels: paged decode attention in place (native_decode.c), the
same kernel over a short prompt's positions for its prefill, and the library that holds
them with the LoRA deltas (native_lora.c, called from lora.py).

Why a C kernel on the CPU at all: the PyTorch decode path gathers every
sequence's scattered blocks into a padded tensor before SDPA, so each step
moves the whole live KV cache three times; decode attention on the CPU is
bound by exactly that traffic. The C kernel reads each K/V row once, where it
lies (vLLM's CPU backend does the same with its own C++ kernels).

How it is built: with the system C compiler, once per machine and source
version, into a cache folder (`HYDRANT_KERNEL_CACHE`, default
`~/.cache/hydrant/kernels`), and loaded with ctypes: no torch headers, so
the build takes about a second, and nothing is compiled at install time. The
binary is tuned for the CPU it is built on (`-march=native`), so the cache key
includes the CPU's feature flags. If there is no compiler or the build fails,
the backend logs it once and keeps the PyTorch path: same results, slower.

`HYDRANT_NATIVE_CFLAGS` (testing and diagnosis only): extra compiler flags,
split like a shell would and appended to the build's, so part of the cache
key. It lets a host with AVX-512 build and run the code paths of lesser CPUs,
e.g. `-mno-avx512f` (the AVX2+FMA paths of an EPYC without AVX-512) or
`-mno-avx2` (the portable loops). Tests pass such flags to `build` and
`open_library` directly instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from hydrant.kernels.cpu import attention

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("native_decode.c")
# every C file of the library (compiled together) and the header they share (in the key)
SOURCES = (SOURCE, SOURCE.with_name("native_lora.c"), SOURCE.with_name("native_elementwise.c"))
HEADERS = (SOURCE.with_name("native_simd.h"),)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
_lock = threading.Lock()
_library: ctypes.CDLL | None = None
_tried = False


def cache_dir() -> Path:
    configured = os.environ.get("HYDRANT_KERNEL_CACHE")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "hydrant" / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags: a binary built with -march=native is only valid on them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def extra_cflags() -> list[str]:
    """The flags `HYDRANT_NATIVE_CFLAGS` adds to the build (none when it is unset)."""
    return shlex.split(os.environ.get("HYDRANT_NATIVE_CFLAGS", ""))


def build(target_dir: Path | None = None, extra: Sequence[str] | None = None) -> Path:
    """Compile the C kernels (if not cached) and return the shared library's path.

    `extra` flags go after CFLAGS (default: `HYDRANT_NATIVE_CFLAGS`'s). The
    build writes to a temporary file and renames it into place, so processes
    building at once never load a half-written library.
    """
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    flags = [*CFLAGS, *(extra_cflags() if extra is None else extra)]
    source = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256(
        source + " ".join(flags).encode() + _cpu_flags().encode() + compiler.encode()
    ).hexdigest()[:16]
    folder = (target_dir or cache_dir()) / key
    library = folder / "libhydrant_cpu_kernels.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    logger.info("compiling the CPU kernels into %s (once per machine)", folder)
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".so", delete=False) as tmp:
        partial = Path(tmp.name)
    try:
        subprocess.run(  # noqa: S603 - our own source, the compiler from PATH/CC
            [compiler, *flags, *map(str, SOURCES), "-o", str(partial), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        partial.replace(library)
    except subprocess.CalledProcessError as exc:
        partial.unlink(missing_ok=True)
        detail = exc.stderr.strip()[-2000:]
        names = ", ".join(path.name for path in SOURCES)
        raise RuntimeError(f"compiling {names} failed: {detail}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return library


_CType = type[ctypes.c_int] | type[ctypes.c_int64] | type[ctypes.c_float] | type[ctypes.c_void_p]
_POINTER: list[_CType] = [ctypes.c_void_p]
_SHAPE_ARGS: list[_CType] = [
    ctypes.c_int,  # batch (rows)
    ctypes.c_int,  # num_heads
    ctypes.c_int,  # num_kv_heads
    ctypes.c_int,  # head_dim
    ctypes.c_int,  # block_size
    ctypes.c_int,  # max_context
    ctypes.c_float,  # scale
    ctypes.c_int,  # num_threads
]


def open_library(path: Path) -> ctypes.CDLL:
    """Load a built library and declare the attention entry points (lora.py declares its
    own)."""
    library = ctypes.CDLL(str(path))
    caches = [*_POINTER * 4, ctypes.c_int64]  # q, k, v, block_tables, table_stride
    decode = library.hydrant_paged_decode_f32
    decode.restype = ctypes.c_int
    decode.argtypes = [*caches, ctypes.c_void_p, ctypes.c_void_p, *_SHAPE_ARGS]  # lens, out
    prefill = library.hydrant_paged_prefill_f32
    prefill.restype = ctypes.c_int
    prefill.argtypes = [
        *caches,
        *_POINTER * 4,  # cu_seqlens, context_lens, skip, out
        *_SHAPE_ARGS[:5],  # sequences, heads, kv heads, head_dim, block_size
        ctypes.c_float,  # scale
        ctypes.c_int,  # num_threads
    ]
    return library


def load() -> ctypes.CDLL | None:
    """The kernel library, built on first use; None (logged once) when it cannot be built."""
    global _library, _tried
    with _lock:
        if _tried:
            return _library
        _tried = True
        try:
            _library = open_library(build())
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            logger.warning("native CPU attention unavailable, using the PyTorch path: %s", exc)
            return None
        return _library


def available() -> bool:
    return load() is not None


def _takes(library: ctypes.CDLL | None, q: torch.Tensor, *caches: torch.Tensor) -> bool:
    """The C kernels can run on these: built, float32 on the CPU, whole GQA groups, and
    every tensor contiguous (`caches`: K, V, then the index tensors the kernel reads)."""
    k_cache, v_cache = caches[0], caches[1]
    return (
        library is not None
        and q.device.type == "cpu"
        and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
        and q.shape[1] % k_cache.shape[2] == 0
        and all(t.is_contiguous() for t in (q, *caches))
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    library: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Same contract as `attention.paged_decode_attention`; float32 CPU tensors run natively.

    Anything else (another dtype, a non-contiguous view, no library) takes the
    PyTorch path, so callers never need to check. A context longer than its block
    table (a broken scheduler invariant; the table's width bounds the score buffer) is
    a ValueError, not a read past the table. `library` (tests, benchmarks): another
    build from `open_library`, e.g. one without AVX-512; default the engine's.
    """
    if library is None:
        library = _library if _tried else load()  # no lock per layer once it is settled
    batch, num_heads, head_dim = q.shape
    native = (
        _takes(library, q, k_cache, v_cache, block_tables, context_lens)
        and block_tables.dtype == context_lens.dtype == torch.int32
    )
    if not native or batch == 0:
        return attention.paged_decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, scale
        )
    assert library is not None
    out = torch.empty_like(q)
    block_size = k_cache.shape[1]
    status = library.hydrant_paged_decode_f32(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        block_tables.shape[1],
        context_lens.data_ptr(),
        out.data_ptr(),
        batch,
        num_heads,
        k_cache.shape[2],
        head_dim,
        block_size,
        max(1, block_tables.shape[1] * block_size),
        scale,
        torch.get_num_threads(),
    )
    if status == -2:
        raise ValueError("a decode context is longer than its block table holds")
    if status != 0:
        raise MemoryError("native decode attention could not allocate its score buffers")
    return out


# Prompts whose context is at most this many tokens take the row kernel for their prefill,
# longer ones SDPA. Measured on one core of a Zen 4 EPYC, a batch of prompts of one length
# (demo shape 4/2 heads of 32, and 12/4 heads of 64): the row kernel's time over SDPA's is
# 0.10-0.41x at 16 tokens, 0.44-0.96x at 64, 0.74-0.78x at 256, 1.03-1.04x at 1,024 and
# 1.18-1.31x at 2,048: per row it rereads the context (from cache), where SDPA's tiles
# share each K/V load among 32+ rows, which pays once prompts are long.
ROWS_MAX_CONTEXT = 512


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    library: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Same contract as `attention.paged_prefill_attention`: the positions of sequences
    whose context is at most `ROWS_MAX_CONTEXT` run as rows of the C kernel, each attending
    to its sequence up to itself, all in one call; longer ones run SDPA per sequence.

    The C side derives each row's sequence and context from the step's per-sequence
    tensors, which every layer of a step passes unchanged: building those index tensors
    here cost 0.1-0.3 ms a layer (a dozen small tensor ops), more than some layers' attention.
    """
    if library is None:
        library = _library if _tried else load()
    if not _takes(library, q, k_cache, v_cache, block_tables) or q.shape[0] == 0:
        return attention.paged_prefill_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale
        )
    assert library is not None
    longer = context_lens > ROWS_MAX_CONTEXT
    if not bool(longer.any()):
        out, skip = torch.empty_like(q), None
    else:
        # the long prompts by SDPA, the short ones' rows left for the row kernel
        out = attention.paged_prefill_attention(
            q,
            k_cache,
            v_cache,
            block_tables,
            cu_seqlens_q,
            context_lens,
            scale,
            skip=longer.logical_not().tolist(),
        )
        if bool(longer.all()):
            return out
        skip = longer.to(torch.uint8)
    tables = block_tables.to(torch.int32).contiguous()
    cu = cu_seqlens_q.to(torch.int32).contiguous()
    contexts = context_lens.to(torch.int32).contiguous()
    status = library.hydrant_paged_prefill_f32(
        q.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        cu.data_ptr(),
        contexts.data_ptr(),
        None if skip is None else skip.data_ptr(),
        out.data_ptr(),
        contexts.shape[0],
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        k_cache.shape[1],
        scale,
        torch.get_num_threads(),
    )
    if status == -2:
        raise ValueError("a prefill context is longer than its block table holds")
    if status != 0:
        raise MemoryError("native prefill attention could not allocate its buffers")
    return out
