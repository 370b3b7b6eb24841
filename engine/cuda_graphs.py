"""CUDA graphs of the decode step: one per padded batch size, replayed instead of launched.

A decode step of a small batch is bound by the host: every layer launches a
dozen kernels that each run for microseconds. Capturing the decode-only
forward (model + logits of every row) once per batch size and replaying it
costs one launch per step (vLLM's design, simplified). A graph runs on fixed
addresses and shapes, so the step's inputs are copied into static buffers of
the largest batch, and a batch of `n` replays the graph of the smallest
captured size `>= n`; the rows past `n` are padding:

- slot -1: the KV write skips it (every backend's `write_kv`), so padding
  never touches the cache;
- context length 1 over block 0: every decode kernel reads one valid token
  (the Triton kernel also accepts 0; 1 is safe for any kernel);
- token 0 at position 0.

The block tables are `[max_bs, ceil(max_model_len / block_size)]`: the decode
kernel picks its context split count from the table width (a shape), so one
graph per batch size replays correctly for any context lengths.

What a graph needs from the forward, checked in the Triton launchers
(`hydrant.kernels.triton_backend` says so too): no host sync, no allocation
sized by a device value, shapes that depend only on the batch size. A kernel
backend declares it with the `graph_capture` feature; only `triton` does (the
`cpu` one plans decode on the host, the references read lengths back), so
graphs run only with the Triton kernels.

Graphs hold the KV cache's and the weights' addresses: they are captured
right after the cache is allocated and dropped when the runner sleeps (the
wake allocates a new cache and captures again). All sizes share one memory
pool, captured largest first so the smaller ones reuse its blocks; a graph's
output may be overwritten by the replay of another size, which is fine since
the sampler reads a step's logits before the next step replays.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from hydrant.engine.attention import AttentionMetadata
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.kv_cache import KVCaches
from hydrant.engine.load_report import timed_phase
from hydrant.engine.model import LlamaForCausalLM
from hydrant.kernels.table import KernelBackend

logger = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 256  # larger decode batches are compute-bound: launches no longer matter
_SMALL_SIZES = (1, 2, 4, 8)
_STEP = 8
PAD_SLOT = -1
PAD_CONTEXT_LEN = 1


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then multiples of 8, up to the first size covering min(max_num_seqs, 256)."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    cap = min(max_num_seqs, MAX_GRAPH_BATCH)
    sizes: list[int] = []
    size = 0
    while size < cap:
        size = _SMALL_SIZES[len(sizes)] if len(sizes) < len(_SMALL_SIZES) else size + _STEP
        sizes.append(size)
    return sizes


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `n` rows; None when none does (run eagerly)."""
    if n < 1:
        return None
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def graphs_unsupported(
    config: EngineConfig, device: torch.device, kernels: KernelBackend
) -> str | None:
    """Why this runner cannot use decode graphs (for the log), or None when it can."""
    if device.type != "cuda":
        return f"device is {device.type}"
    if config.enforce_eager:
        return "enforce_eager is set"
    if not kernels.has("graph_capture"):
        return (
            f"the {kernels.name} kernels ({kernels.detail}) cannot be captured in a graph "
            "(only the Triton ones can)"
        )
    return None


class DecodeGraphs:
    """Static input buffers of the largest batch and one captured decode forward per size."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: KVCaches,
        batch_sizes: list[int],
        max_blocks_per_seq: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = sorted(batch_sizes)
        self.device = device
        max_bs = self.sizes[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_bs,), PAD_SLOT, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(
            (max_bs, max_blocks_per_seq), dtype=torch.int32, device=device
        )
        self.context_lens = torch.full((max_bs,), PAD_CONTEXT_LEN, dtype=torch.int32, device=device)
        self._no_prefill_table = torch.zeros((0, 1), dtype=torch.int32, device=device)
        self._no_prefill_cu = torch.zeros(1, dtype=torch.int32, device=device)
        self._no_prefill_lens = torch.zeros(0, dtype=torch.int32, device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self.replays = 0  # steps served by a graph (tests and the bench check they happened)

    @property
    def max_batch(self) -> int:
        return self.sizes[-1]

    def metadata(self, size: int) -> AttentionMetadata:
        """Decode-only metadata over the first `size` rows of the static buffers."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            num_decode_tokens=size,
            decode_block_tables=self.block_tables[:size],
            decode_context_lens=self.context_lens[:size],
            prefill_block_tables=self._no_prefill_table,
            prefill_cu_seqlens_q=self._no_prefill_cu,
            prefill_context_lens=self._no_prefill_lens,
            prefill_max_q_len=0,
        )

    def forward(self, size: int) -> torch.Tensor:
        """The captured work: the decode forward and the logits of all `size` rows."""
        hidden = self.model(
            self.input_ids[:size], self.positions[:size], self.kv_caches, self.metadata(size)
        )
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> None:
        """Warm each size up eagerly (Triton compiles, cuBLAS picks), then capture it."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.sizes):  # largest first: the others fit in its pool blocks
            self.forward(size)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            # thread_local: another engine of this process may be stepping on its own thread
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                logits = self.forward(size)
            self._graphs[size] = graph
            self._logits[size] = logits
        torch.cuda.synchronize(self.device)

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        num_sampled: int,
    ) -> torch.Tensor | None:
        """Logits [n, V] of a decode-only step whose every row is sampled; None: run it eagerly.

        The result is a view of the graph's output buffer, valid until the next replay.
        """
        n = int(input_ids.shape[0])
        size = bucket_for(n, self.sizes)
        tables = meta.decode_block_tables
        if (
            size is None
            or meta.num_decode_tokens != n
            or meta.num_prefills != 0
            or num_sampled != n
            or tables.shape[1] > self.block_tables.shape[1]
        ):
            return None
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.context_lens[:n].copy_(meta.decode_context_lens)
        self.block_tables[:n, : tables.shape[1]].copy_(tables)
        if size > n:  # rows a larger earlier step left behind become padding again
            self.slot_mapping[n:size].fill_(PAD_SLOT)
            self.context_lens[n:size].fill_(PAD_CONTEXT_LEN)
            self.block_tables[n:size].zero_()
        logits = self._replay(size)
        self.replays += 1
        return logits[:n]

    def _replay(self, size: int) -> torch.Tensor:
        self._graphs[size].replay()
        return self._logits[size]


def capture_decode_graphs(
    model: LlamaForCausalLM,
    kv_caches: KVCaches,
    config: EngineConfig,
    max_model_len: int,
    device: torch.device,
) -> DecodeGraphs | None:
    """Decode graphs for this cache, or None (CPU, `enforce_eager`, a backend without
    `graph_capture`, failed capture).

    A failed capture is logged and the runner stays eager: slower, never wrong.
    """
    reason = graphs_unsupported(config, device, model.ops)
    if reason is not None:
        if device.type == "cuda":
            logger.info("decode CUDA graphs off: %s", reason)
        return None
    sizes = graph_batch_sizes(config.max_num_seqs)
    max_blocks = -(-max_model_len // config.block_size)
    started = time.perf_counter()
    with timed_phase("cuda_graphs"):
        graphs = DecodeGraphs(model, kv_caches, sizes, max_blocks, device)
        try:
            graphs.capture()
        except Exception:  # Triton compile errors, OOM, illegal capture: all mean "run eagerly"
            logger.warning("decode CUDA graph capture failed; running eagerly", exc_info=True)
            del graphs
            torch.cuda.empty_cache()
            return None
    logger.info(
        "decode CUDA graphs: %d batch sizes up to %d captured in %.2fs",
        len(sizes),
        sizes[-1],
        time.perf_counter() - started,
    )
    return graphs
