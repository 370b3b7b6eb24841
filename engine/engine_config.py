"""The engine's operating settings, separate from the model's own config.

`ModelConfig` (config.py) says what the checkpoint *is*; `EngineConfig` says
how we choose to *run* it: batch limits, KV memory, device. It is a frozen
value object read once and passed in, never read from the environment here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from hydrant.engine.errors import EngineError

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


KERNEL_CHOICES = ("auto", "cpu", "reference", "triton")
OLD_KERNEL_NAMES = ("torch", "native", "hydrant")  # mapped by engine/ops.py


def is_cpu_device(device: str) -> bool:
    """`device` ("cpu", "cuda:1", ...) names the CPU: the defaults that differ by device."""
    return device.split(":")[0] == "cpu"


# Sequences an engine runs at once unless configured (`default_max_num_seqs`).
CPU_MAX_NUM_SEQS = 128
DEVICE_MAX_NUM_SEQS = 256


def default_max_num_seqs(device: str) -> int:
    """The running-sequence cap for `device` when the servers' setting is 0 ("by device").

    On a CPU a decode step's cost grows with every running sequence (attention over
    each one's context, on the one core the engine has), so a burst admitted whole
    makes every stream slower per token without finishing the burst sooner: an
    engine-only replay of bench/serving.py's unbounded burst (200 x 256 in / 128 out,
    demo model, one thread, step times in thread CPU time) gave TPOT p50 20.2 ms at
    128 against 30.5 ms at 256, ITL p99 30.5 against 40.4 ms, TTFT p50 1,042 against
    1,096 ms and 11 % more tokens per CPU second. vLLM's CPU backend uses 128 too. A
    GPU step is nearly flat in the batch size up to a few hundred: 256 (vLLM's GPU
    default)."""
    return CPU_MAX_NUM_SEQS if is_cpu_device(device) else DEVICE_MAX_NUM_SEQS


# Tokens a step of background work alone may compute unless configured
# (`default_background_step_tokens`).
CPU_BACKGROUND_STEP_TOKENS = 64
DEVICE_BACKGROUND_STEP_TOKENS = 512


def default_background_step_tokens(setting: int | None, device: str) -> int | None:
    """The background step cap for `device`: the servers' setting, or by device when unset.

    An interactive request that arrives waits for the step in progress, so a step of
    batch work alone must cost about a decode step. On a CPU a step's cost grows with
    its tokens from the first one: 64 keeps it near a decode step (issue #27's traces:
    the wait on the step in progress fell from p99 25-44 ms to 6 ms, the batch lost 3 %
    of its lines). A GPU step of a few hundred tokens costs about what a decode step
    does, and 64 there would starve the batch's prefill: 512. 0: no cap (None)."""
    if setting is None:
        cpu = is_cpu_device(device)
        return CPU_BACKGROUND_STEP_TOKENS if cpu else DEVICE_BACKGROUND_STEP_TOKENS
    return setting or None


class EngineConfigError(EngineError):
    """A setting that makes no sense (a zero block size, a fraction above one)."""


NumThreads = int | Literal["auto"]


def parse_num_threads(text: str | int) -> NumThreads:
    """`"auto"` or a positive integer, from a setting (`HYDRANT_ENGINE_THREADS`) or a flag."""
    if isinstance(text, int):
        value = text
    elif text.strip().lower() == "auto":
        return "auto"
    else:
        try:
            value = int(text.strip())
        except ValueError:
            raise EngineConfigError(
                f"engine threads must be 'auto' or a positive integer, got {text!r}"
            ) from None
    if value < 1:
        raise EngineConfigError(f"engine threads must be >= 1, got {value}")
    return value


# Linear weights per (cores x (cores - 1)) at and above which `auto` gives the engine every
# core. The serving front (the gateway's and the worker's event loops: parse, render, SSE)
# spends about 150 us of CPU per streamed token (bench/upstream.py: 153-191 ms per 1,000
# output tokens), and one core of float32 oneDNN GEMM about 80 GFLOP/s: a model of P linear
# weights costs the engine c = 2P / 80e9 s of one core per token. With a core kept for the
# front a token takes c / (N - 1); with every core the front preempts an engine thread and
# the whole OpenMP region waits for it, c / N + 150 us. Every core wins when
# c > N (N - 1) 150 us, i.e. P > N (N - 1) x 6M: on 2 cores 12M (the ~100M bench model, 75M
# linear weights, yes; the demo model, 0.7M, no), on 16 cores 1.4B.
FRONT_PARAMS_PER_CORE_PAIR = 6_000_000


def resolve_num_threads(
    setting: NumThreads,
    cpu_count: int | None,
    environ: Mapping[str, str],
    linear_params: int | None = None,
) -> int:
    """The torch intra-op thread count an engine runs with.

    An integer is taken as it is. `"auto"` is `OMP_NUM_THREADS` when the
    environment sets it to a positive integer (an operator's or a launcher's
    explicit choice, e.g. a container pinned to some cores, wins). Else it
    depends on how much compute a token costs (`linear_params`, the model's
    projection weights): a model small against the serving front's own CPU per
    token gets one core fewer than the machine has, at least one, since the
    engine's OpenMP threads spin while they wait and a thread for every core
    fights the process's event loop (the worker's HTTP front, or the gateway in
    the embedded mode) for every core: on a 2-core box that fight doubled the
    demo model's time per output token (issue #24). A model at least
    `N (N - 1) x FRONT_PARAMS_PER_CORE_PAIR` weights gets all N cores: there the
    front's share is smaller than the kept core (the ~100M model on 2 cores:
    1.5-1.8x vLLM's output tokens/s through HTTP, every latency under vLLM's,
    where one thread had TTFT over vLLM's). Unknown size: one core kept.
    """
    if setting != "auto":
        return setting
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp.isdigit() and int(omp) >= 1:
        return int(omp)
    cores = cpu_count or 1
    if linear_params is not None and linear_params >= (
        cores * (cores - 1) * FRONT_PARAMS_PER_CORE_PAIR
    ):
        return cores
    return max(1, cores - 1)


def usable_cpu_count() -> int | None:
    """The cores this process may run on (its affinity mask: a container's or `taskset`'s
    cpuset), not the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def apply_num_threads(setting: NumThreads | None, linear_params: int | None = None) -> int:
    """Set torch's intra-op threads for this process from `setting` (None: leave them) for
    a model of `linear_params` projection weights; returns the count in force.
    Process-wide: every engine of the process shares it, and every thread that starts
    torch work from now on (the async front's step thread starts after the build); a
    thread that already ran a parallel op keeps its OpenMP count."""
    if setting is not None:
        threads = resolve_num_threads(setting, usable_cpu_count(), os.environ, linear_params)
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
    return torch.get_num_threads()


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one engine instance.

    The lane budgets implement length tiering: requests whose prompt has at
    least `long_prompt_threshold` tokens draw on `long_lane_tokens` per step,
    the others on `short_lane_tokens`, and both together on
    `max_num_batched_tokens`, so a long prefill cannot crowd short decodes
    out of a step.

    `kv_cache_bytes` is the KV budget on CPU (no way to measure "free" memory
    that other processes will not take); on CUDA the budget is measured after
    a profiling forward pass and scaled by `gpu_memory_utilization`.
    `num_gpu_blocks` overrides both (tests use it to force preemption).
    `kernels` names the row of the kernel table the engine runs, chosen once
    at build (engine/ops.py): "auto" runs the Triton kernels on CUDA and the
    `cpu` backend on the CPU (C decode attention and oneDNN linears in
    float32); "cpu" insists on the C kernel, "reference" runs the PyTorch
    references, "triton" the Triton kernels. The names of before the table
    still work: "torch" is "reference", "native" is "cpu", "hydrant" is
    "triton" on CUDA and "reference" elsewhere.
    `dtype="auto"` means the checkpoint's dtype on CUDA and float32 on CPU,
    where half-precision matmuls are slow or missing.
    `quantization` quantizes the float weights after loading (weight-only,
    round-to-nearest; the output head stays in float); a checkpoint written
    by `hydrant models quantize` is loaded as it is, without re-quantizing.
    `kv_cache_dtype="int8"` stores K/V as int8 with a float32 scale per token
    per KV head (about half the bytes of float16, a quarter of float32), so
    the same budget holds about twice (four times) the blocks; "auto" stores
    them in the compute dtype.
    `enforce_eager` turns the decode steps' CUDA graphs off (engine/cuda_graphs.py):
    every step then launches its kernels one by one, as on the CPU.
    `max_prefill_tokens_while_decoding` caps the prompt tokens of a step that also
    runs decodes (token_budget.py): a long prefill chunk stalls every running
    stream's next token for the whole step. The cap is the base; it scales up by how
    many more requests wait for their prefill than decode (`token_budget.prefill_cap`).
    None: no cap beyond the lanes'.
    `max_background_step_tokens` caps the tokens background work (batch lines)
    computes in a step, decodes and prompt chunks together (token_budget.py): a
    foreground request that arrives waits for the step in progress, so a step of
    background work alone must stay short. 64 keeps it near a decode step on the CPU;
    on a GPU, where a step of a few hundred tokens costs about as much as a decode
    step, raise it (512) or the batch's prefill throughput drops. None: no cap.
    `num_threads` is torch's intra-op thread count, set once when the engine is
    built (`LLMEngine.from_pretrained`): an integer, or "auto" (see
    `resolve_num_threads`: `OMP_NUM_THREADS` if set, else one core fewer than the
    machine, or every core for a model large enough). None leaves the process's setting
    alone (tests, benchmarks that set it themselves); the servers pass "auto" unless
    `HYDRANT_ENGINE_THREADS` says otherwise.
    LoRA adapters (engine/lora_manager.py): `max_loras` are held in device memory at once
    (slots, least recently used evicted; 0 serves none), `max_cpu_loras` more in host
    memory, each of a rank up to `max_lora_rank` (every slot is padded to it). On CUDA the
    KV budget leaves room for all the slots (`LoraSlots.full_bytes`), so loading adapters
    later cannot run the device out of memory.
    """

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    short_lane_tokens: int = 8192
    long_lane_tokens: int = 2048
    long_prompt_threshold: int = 512
    kv_cache_bytes: int = 1 << 30
    num_gpu_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    device: str = "cpu"
    enable_prefix_caching: bool = True
    prefix_cache_per_tenant: bool = True
    max_model_len: int | None = None
    show_progress: bool = True
    kernels: str = "auto"
    quantization: Literal["int8", "int4"] | None = None
    kv_cache_dtype: Literal["auto", "int8"] = "auto"
    enforce_eager: bool = False
    num_threads: NumThreads | None = None
    max_prefill_tokens_while_decoding: int | None = 1024
    max_background_step_tokens: int | None = 64
    max_loras: int = 8
    max_cpu_loras: int = 32
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        positive = {
            "block_size": self.block_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "short_lane_tokens": self.short_lane_tokens,
            "long_lane_tokens": self.long_lane_tokens,
            "long_prompt_threshold": self.long_prompt_threshold,
            "kv_cache_bytes": self.kv_cache_bytes,
            "max_cpu_loras": self.max_cpu_loras,
            "max_lora_rank": self.max_lora_rank,
        }
        for name, value in positive.items():
            if value < 1:
                raise EngineConfigError(f"EngineConfig.{name} must be >= 1, got {value}")
        if self.max_loras < 0:
            raise EngineConfigError(f"EngineConfig.max_loras must be >= 0, got {self.max_loras}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise EngineConfigError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise EngineConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise EngineConfigError(
                f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {self.dtype!r}"
            )
        if self.max_model_len is not None and self.max_model_len < 1:
            raise EngineConfigError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.kernels not in KERNEL_CHOICES + OLD_KERNEL_NAMES:
            raise EngineConfigError(
                f"kernels must be one of {', '.join(map(repr, KERNEL_CHOICES))} (or an old name: "
                f"{', '.join(map(repr, OLD_KERNEL_NAMES))}), got {self.kernels!r}"
            )
        if self.quantization not in (None, "int8", "int4"):
            raise EngineConfigError(
                f"quantization must be None, 'int8' or 'int4', got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in ("auto", "int8"):
            raise EngineConfigError(
                f"kv_cache_dtype must be 'auto' or 'int8', got {self.kv_cache_dtype!r}"
            )
        cap = self.max_prefill_tokens_while_decoding
        if cap is not None and cap < 1:
            raise EngineConfigError(f"max_prefill_tokens_while_decoding must be >= 1, got {cap}")
        cap = self.max_background_step_tokens
        if cap is not None and cap < 1:
            raise EngineConfigError(f"max_background_step_tokens must be >= 1, got {cap}")
        if self.num_threads is not None:
            parse_num_threads(self.num_threads)  # raises on 0, a negative, a typo
        if not (self.device == "cpu" or self.device.startswith("cuda")):
            raise EngineConfigError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")

    def torch_dtype(self, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        """The dtype to compute in, resolving "auto" against the checkpoint and device."""
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if self.device == "cpu" or checkpoint_dtype is None:
            return torch.float32
        return checkpoint_dtype


def parse_dtype(name: str | None) -> torch.dtype | None:
    """Map a config.json dtype string ("bfloat16", "torch.float16") to a torch dtype."""
    if not name:
        return None
    return _DTYPES.get(name.removeprefix("torch."))
