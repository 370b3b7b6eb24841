"""Runs one scheduled step as one batched forward over the paged KV cache.

The step's chunks are flattened into one token batch (decodes first, then
prefill chunks), with the slot of each token in the cache, each sequence's
block table and context length: the varlen layout of vLLM/FlashAttention.
Logits are computed only for the last token of each sequence whose chunk
reaches its end; the engine samples those. A request with `prompt_logprobs`
also gets the logits of its prompt positions, scored a slice of rows at a time
(a prompt's full logits would be tokens x vocabulary floats at once). An `embed`
request gets no logits at all: the final hidden state of its last prompt token
(or, as the checkpoint declares, the mean of all of them, summed chunk by chunk, or the
first one's), normalized, once its last chunk ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hydrant.engine.attention import AttentionMetadata, DecodePlanner, build_metadata
from hydrant.engine.config import ModelConfig
from hydrant.engine.cuda_graphs import DecodeGraphs, capture_decode_graphs
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.kv_cache import (
    KVCaches,
    allocate_kv_caches,
    bytes_per_block,
    cache_bytes,
    check_capacity,
    copy_blocks,
    kv_storage_dtype,
    num_blocks_from_budget,
)
from hydrant.engine.load_report import timed_phase
from hydrant.engine.lora_batch import LoraBatch, build_lora_batch
from hydrant.engine.lora_slots import LoraSlots
from hydrant.engine.model import LlamaForCausalLM
from hydrant.engine.ops import bind_linears, select_backend
from hydrant.engine.quantized_weights import load_engine_model
from hydrant.engine.sampler import TokenLogprob, score_tokens
from hydrant.engine.scheduler import ScheduledSeq, SchedulerOutput
from hydrant.engine.sequence import Sequence
from hydrant.engine.sleep_mode import offload_weights, restore_weights

logger = logging.getLogger(__name__)


SCORE_ROWS = 512  # prompt positions scored at once: logits of [SCORE_ROWS, vocab] floats


@dataclass
class PromptRows:
    """Rows of a step's batch whose logits score prompt tokens `first`, `first + 1`, ..."""

    seq: Sequence
    first: int
    rows: list[int]
    targets: list[int]


@dataclass(frozen=True)
class PoolRows:
    """Rows [first, end) of this step's hidden states an embed sequence pools: the last
    prompt token's (last), every token of the chunk (mean), position 0's (cls). `fresh`:
    nothing pooled before counts (the prompt's first chunk, also after a preemption
    restarts it); `final`: the prompt's last chunk, after which its vector is ready."""

    seq: Sequence
    first: int
    end: int
    fresh: bool
    final: bool


@dataclass
class ModelOutput:
    """Logits [N, V] float32 for the sequences that need a token, in the same order, and
    the scores of prompt tokens this step computed for requests that asked for them."""

    logits: torch.Tensor
    sample_seqs: list[Sequence]
    prompt_logprobs: list[tuple[Sequence, int, list[TokenLogprob]]] = field(default_factory=list)
    embeddings: list[tuple[Sequence, list[float]]] = field(default_factory=list)


@dataclass
class StepBatch:
    """One step's flattened tokens, and which rows of its hidden states each use needs."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_idx: list[int]
    sample_seqs: list[Sequence]
    scored: list[PromptRows]
    pooled: list[PoolRows]  # the rows each embed sequence pools from this step
    lora: LoraBatch | None = None  # each chunk's adapter slot; None: no adapter this step


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        model_config: ModelConfig,
        config: EngineConfig,
        max_model_len: int,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.model_config = model_config
        self.config = config
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.kv_dtype = kv_storage_dtype(config, dtype)
        # a `planned_decode` backend plans each step's decode gathers once, for every layer
        self.decode_planner: DecodePlanner | None = None
        kernels = model.ops
        if kernels.has("planned_decode") and not self.kv_int8:
            self.decode_planner = kernels.planner()(
                self.block_size,
                model_config.num_key_value_heads,
                model_config.head_dim,
                dtype,
                self.device,
            )
        # LoRA adapters' device slots: no memory until a first adapter is loaded
        self.lora_slots: LoraSlots | None = None
        if config.max_loras > 0:
            self.lora_slots = LoraSlots(
                model_config, config.max_loras, config.max_lora_rank, dtype, self.device
            )
        peak = None
        if self.device.type == "cuda":
            with timed_phase("profile"):
                peak = self._profile_peak_bytes()
            if self.lora_slots is not None:  # room for every slot, filled or not
                peak += self.lora_slots.full_bytes()
        self.num_blocks = num_blocks_from_budget(model_config, config, dtype, peak)
        check_capacity(self.num_blocks, self.block_size, max_model_len)
        self.kv_caches: KVCaches = []
        self.sleeping = False
        self.decode_graphs: DecodeGraphs | None = None
        with timed_phase("kv_allocate"):
            self._allocate_kv()
        self._log_kv()
        self._capture_graphs()

    def _log_kv(self) -> None:
        """The cache's bytes, and what the same blocks would take in the compute dtype."""
        float_bytes = self.num_blocks * bytes_per_block(
            self.model_config, self.block_size, self.dtype
        )
        logger.info(
            "KV cache: %d blocks of %d tokens, %s, %d bytes (%d in %s)",
            self.num_blocks,
            self.block_size,
            "int8 + float32 scales" if self.kv_int8 else str(self.dtype).removeprefix("torch."),
            self.kv_cache_bytes,
            float_bytes,
            str(self.dtype).removeprefix("torch."),
        )

    @property
    def kv_int8(self) -> bool:
        """True when the cache stores int8 codes with per-token, per-head scales."""
        return self.kv_dtype == torch.int8

    def _allocate_kv(self) -> None:
        """The cache tensors; on CPU lazily zeroed by the kernel (see host_memory.py)."""
        self.kv_caches = allocate_kv_caches(
            self.model_config, self.num_blocks, self.block_size, self.kv_dtype, self.config.device
        )

    def _capture_graphs(self) -> None:
        """Decode CUDA graphs over the cache just allocated (None on CPU or enforce_eager,
        and for an embedding-only model, which never decodes)."""
        if self.model_config.embedding_only:
            self.decode_graphs = None
            return
        self.decode_graphs = capture_decode_graphs(
            self.model, self.kv_caches, self.config, self.max_model_len, self.device
        )

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache tensors hold now, scales included (0 while asleep)."""
        return cache_bytes(self.kv_caches)

    def sleep(self) -> None:
        """Free the KV cache and (on CUDA) move the weights to a pinned host copy."""
        if self.sleeping:
            return
        self.decode_graphs = None
        self.kv_caches = []
        if self.lora_slots is not None:  # idle: nothing pins a slot; reloaded on next use
            self.lora_slots.clear()
        if self.device.type == "cuda":
            with timed_phase("weights_to_host"):
                moved = offload_weights(self.model)
            torch.cuda.empty_cache()
            logger.info("asleep: %d weight bytes kept in pinned host memory", moved)
        self.sleeping = True

    def wake(self) -> None:
        """Weights back to the device from the host copy, then a fresh KV cache of the same size."""
        if not self.sleeping:
            return
        if self.device.type == "cuda":
            with timed_phase("weights_to_device"):
                restore_weights(self.model, self.device)
        with timed_phase("kv_allocate"):
            self._allocate_kv()
        self._capture_graphs()
        self.sleeping = False

    @classmethod
    def from_pretrained(
        cls, model_dir: Path, model_config: ModelConfig, config: EngineConfig, max_model_len: int
    ) -> ModelRunner:
        dtype = config.torch_dtype(model_config.checkpoint_dtype)
        kernels = select_backend(config, dtype)
        model = load_engine_model(model_dir, model_config, config, dtype, max_model_len, kernels)
        bind_linears(model, kernels)
        logger.info("model ops: %s (%s)", kernels.name, kernels.detail)
        return cls(model, model_config, config, max_model_len, dtype)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> ModelOutput:
        copy_blocks(self.kv_caches, out.block_copies)
        # decodes first, shortest context first: the decode plan's groups are then slices
        items = sorted(out.scheduled, key=_batch_order)
        batch = self._prepare(items)
        graphable = not batch.scored and not batch.pooled and batch.lora is None
        if self.decode_graphs is not None and graphable:
            logits = self.decode_graphs.run(
                batch.input_ids, batch.positions, batch.meta, len(batch.sample_idx)
            )
            if logits is not None:
                return ModelOutput(logits, batch.sample_seqs)
        hidden = self.model(
            batch.input_ids, batch.positions, self.kv_caches, batch.meta, batch.lora
        )
        prompt_logprobs = [(p.seq, p.first, self._score(hidden, p)) for p in batch.scored]
        embeddings = self._pool(hidden, batch.pooled)
        if not batch.sample_seqs:
            empty = torch.empty(0, self.model_config.vocab_size, device=self.device)
            return ModelOutput(empty, [], prompt_logprobs, embeddings)
        if len(batch.sample_idx) == hidden.shape[0]:  # every row (increasing, distinct): all
            logits = self.model.compute_logits(hidden)
        else:
            index = torch.tensor(batch.sample_idx, dtype=torch.long, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))
        return ModelOutput(logits, batch.sample_seqs, prompt_logprobs, embeddings)

    def _pool(
        self, hidden: torch.Tensor, pooled: list[PoolRows]
    ) -> list[tuple[Sequence, list[float]]]:
        """Finished prompts' embeddings, pooled in float32 as the model declares (a mean
        sums chunk by chunk), normalized after an optional Matryoshka cut."""
        result = []
        for part in pooled:
            seq = part.seq
            if part.end > part.first:
                rows = hidden[part.first : part.end].float().sum(dim=0)
                seq.pool_sum = rows if part.fresh or seq.pool_sum is None else seq.pool_sum + rows
            if not part.final:
                continue
            assert seq.pool_sum is not None  # the first chunk pooled its rows
            vector = seq.pool_sum
            if self.model_config.pooling == "mean":
                vector = vector / len(seq.prompt_token_ids)
            seq.pool_sum = None
            dims = seq.request.params.embed_dimensions
            cut = vector if dims is None else vector[:dims]
            result.append((seq, torch.nn.functional.normalize(cut, dim=0).tolist()))
        return result

    def _pool_rows(self, seq: Sequence, first: int, start: int, end: int) -> PoolRows | None:
        """What an embed sequence's chunk [start, end), laid out from row `first`, pools."""
        final = end == seq.num_tokens
        pooling = self.model_config.pooling
        if pooling == "mean":
            return PoolRows(seq, first, first + end - start, start == 0, final)
        if pooling == "cls":
            return PoolRows(seq, first, first + 1 if start == 0 else first, start == 0, final)
        if final:
            return PoolRows(seq, first + end - start - 1, first + end - start, True, True)
        return None

    def _score(self, hidden: torch.Tensor, prompt: PromptRows) -> list[TokenLogprob]:
        k = prompt.seq.request.params.prompt_logprobs or 0
        entries: list[TokenLogprob] = []
        for at in range(0, len(prompt.rows), SCORE_ROWS):
            rows = self._tensor(prompt.rows[at : at + SCORE_ROWS], torch.long)
            targets = self._tensor(prompt.targets[at : at + SCORE_ROWS], torch.long)
            logits = self.model.compute_logits(hidden.index_select(0, rows))
            entries.extend(score_tokens(logits, targets, k))
        return entries

    def _prepare(self, items: list[ScheduledSeq]) -> StepBatch:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        sample_idx: list[int] = []
        sample_seqs: list[Sequence] = []
        dec_tables: list[list[int]] = []
        dec_ctx: list[int] = []
        pre_tables: list[list[int]] = []
        pre_ctx: list[int] = []
        scored: list[PromptRows] = []
        pooled: list[PoolRows] = []
        cu = [0]
        row_slots = [item.seq.lora_slot for item in items]
        for item in items:
            seq, start, n = item.seq, item.start, item.num_new_tokens
            end = start + n
            table = seq.block_table
            prompt = seq.prompt_token_ids
            last_scored = min(end, len(prompt) - 1)  # position p scores prompt token p + 1
            if seq.request.params.prompt_logprobs is not None and start < last_scored:
                rows = list(range(len(ids), len(ids) + last_scored - start))
                scored.append(PromptRows(seq, start + 1, rows, prompt[start + 1 : last_scored + 1]))
            ids.extend(seq.tokens(start, end))
            pos.extend(range(start, end))
            p = start
            while p < end:
                offset = p % bs
                take = min(bs - offset, end - p)
                base = table[p // bs] * bs + offset
                slots.extend(range(base, base + take))
                p += take
            if n == 1:
                dec_tables.append(table)
                dec_ctx.append(end)
            else:
                pre_tables.append(table)
                pre_ctx.append(end)
                cu.append(cu[-1] + n)
            if seq.request.params.embed:
                part = self._pool_rows(seq, len(ids) - n, start, end)
                if part is not None:
                    pooled.append(part)
            elif end == seq.num_tokens:
                sample_idx.append(len(ids) - 1)
                sample_seqs.append(seq)
        meta = build_metadata(
            slots,
            dec_tables,
            dec_ctx,
            pre_tables,
            pre_ctx,
            cu,
            bs,
            self.device,
            self.decode_planner,
        )
        lora = None
        if self.lora_slots is not None:
            lengths = [item.num_new_tokens for item in items]
            lora = build_lora_batch(
                self.model.ops, self.lora_slots, row_slots, lengths, len(dec_ctx)
            )
        tokens = self._tensor([ids, pos], torch.long)  # one creation (one copy) for both rows
        return StepBatch(
            tokens[0],
            tokens[1],
            meta,
            sample_idx,
            sample_seqs,
            scored,
            pooled,
            lora,
        )

    def _tensor(self, values: list[int] | list[list[int]], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _profile_peak_bytes(self) -> int:
        """Peak CUDA memory of the largest step, run once on a throwaway KV cache."""
        tokens = min(self.config.max_num_batched_tokens, self.max_model_len * 8)
        seq_len = min(self.max_model_len, tokens)
        num_seqs = max(1, tokens // seq_len)
        blocks_per_seq = -(-seq_len // self.block_size)
        caches = allocate_kv_caches(
            self.model_config,
            num_seqs * blocks_per_seq,
            self.block_size,
            self.kv_dtype,
            self.config.device,
        )
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        total = num_seqs * seq_len
        seq_starts = torch.arange(num_seqs, device=self.device) * blocks_per_seq * self.block_size
        slots = (seq_starts[:, None] + torch.arange(seq_len, device=self.device)).flatten()
        tables = torch.arange(num_seqs * blocks_per_seq, dtype=torch.int32, device=self.device)
        meta = AttentionMetadata(
            slot_mapping=slots,
            num_decode_tokens=0,
            decode_block_tables=torch.zeros((0, 1), dtype=torch.int32, device=self.device),
            decode_context_lens=torch.zeros(0, dtype=torch.int32, device=self.device),
            prefill_block_tables=tables.view(num_seqs, blocks_per_seq),
            prefill_cu_seqlens_q=torch.arange(
                0, total + 1, seq_len, dtype=torch.int32, device=self.device
            ),
            prefill_context_lens=torch.full(
                (num_seqs,), seq_len, dtype=torch.int32, device=self.device
            ),
            prefill_max_q_len=seq_len,
        )
        ids = torch.zeros(total, dtype=torch.long, device=self.device)
        positions = torch.arange(seq_len, device=self.device).repeat(num_seqs)
        with torch.inference_mode():
            hidden = self.model(ids, positions, caches, meta)
            # the sampler's worst case: a full batch of rows, softmaxed and sorted (top-p)
            rows = min(self.config.max_num_seqs, total)
            logits = hidden[:rows]
            if not self.model_config.embedding_only:
                logits = self.model.compute_logits(logits)
                logits.softmax(dim=-1).sort(dim=-1)
        torch.cuda.synchronize(self.device)
        peak = int(torch.cuda.max_memory_allocated(self.device))
        held = cache_bytes(caches)
        del caches, hidden, logits
        torch.cuda.empty_cache()
        return peak - held


def _batch_order(item: ScheduledSeq) -> tuple[bool, int]:
    """Decodes (one new token) before prefill chunks; decodes by ascending context length."""
    is_prefill = item.num_new_tokens != 1
    return is_prefill, 0 if is_prefill else item.start
