"""The Llama-family decoder over a paged KV cache.

One module serves Llama 2/3, Qwen2, Qwen3 and Mistral: their differences
are switches of `ModelConfig` (Qwen3's is a per-head RMSNorm of q and k).
The forward takes a whole step's tokens flattened into one `[T]` batch
(every sequence's chunk, decodes first) and the step's `AttentionMetadata`,
so a step is one forward whatever mix of prefills and decodes it holds.
q/k/v and gate/up are fused into one matmul each (the loader concatenates
the checkpoint's separate tensors), which halves the number of small
matmuls a decode step launches.

Parameters are named like transformers' modules (`model.layers.0.mlp...`),
fused ones excepted, so the loader's name mapping stays a short table. The
elementwise and attention ops come from one row of the kernel table
(`hydrant.kernels.backends`), chosen by the engine at build (engine/ops.py):
the `cpu` backend on the CPU, `triton` on CUDA, `reference` when asked.

An int8 KV cache (`EngineConfig.kv_cache_dtype="int8"`: a layer's cache then
also holds per-token, per-head K/V scales) takes the same write/decode/prefill
calls of the same row, with the scales as keyword arguments (the row's
`kv_int8` feature). A step whose metadata carries a decode plan (a
`planned_decode` row's, built once per step by the runner) attends over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from hydrant.engine.attention import AttentionMetadata
from hydrant.engine.config import ModelConfig
from hydrant.engine.kv_cache import KVCache
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.rope_cache import build_rope_cache
from hydrant.kernels.table import KernelBackend

if TYPE_CHECKING:
    from hydrant.engine.lora_batch import LayerLora, LoraBatch


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, ops: KernelBackend) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelBackend) -> None:
        super().__init__()
        self.ops = ops
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_proj = nn.Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)
        if lora is not None:
            lora.add(qkv, hidden, "qkv_proj")
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim))[0].view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim))[0].view_as(k)
        ops = self.ops
        q, k = ops.rotary_embedding(positions, q, k, cos_sin_cache)
        scales: dict[str, torch.Tensor] = {}
        if len(kv_cache) == 4:  # int8 codes + float32 scales (the backend's kv_int8 feature)
            k_cache, v_cache, scales["k_scale"], scales["v_scale"] = kv_cache
        else:
            k_cache, v_cache = kv_cache
        ops.write_kv(k, v, k_cache, v_cache, meta.slot_mapping, **scales)
        n_dec = meta.num_decode_tokens
        parts = []
        if n_dec > 0 and meta.decode_plan is not None:  # a planned_decode backend, float cache
            parts.append(ops.planned()(q[:n_dec], k_cache, v_cache, meta.decode_plan, self.scale))
        elif n_dec > 0:
            parts.append(
                ops.paged_decode_attention(
                    q[:n_dec],
                    k_cache,
                    v_cache,
                    meta.decode_block_tables,
                    meta.decode_context_lens,
                    self.scale,
                    **scales,
                )
            )
        if n_dec < num_tokens:
            parts.append(
                ops.paged_prefill_attention(
                    q[n_dec:],
                    k_cache,
                    v_cache,
                    meta.prefill_block_tables,
                    meta.prefill_cu_seqlens_q,
                    meta.prefill_context_lens,
                    self.scale,
                    max_seqlen_q=meta.prefill_max_q_len,
                    **scales,
                )
            )
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        attn = out.reshape(num_tokens, self.q_size)
        projected = self.o_proj(attn)
        if lora is not None:
            lora.add(projected, attn, "o_proj")
        return projected


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelBackend) -> None:
        super().__init__()
        self.ops = ops
        inter = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * inter, bias=config.mlp_bias)
        self.down_proj = nn.Linear(inter, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor, lora: LayerLora | None = None) -> torch.Tensor:
        if lora is None:
            return self.down_proj(self.ops.silu_and_mul(self.gate_up_proj(x)))
        gate_up = self.gate_up_proj(x)
        lora.add(gate_up, x, "gate_up_proj")
        act = self.ops.silu_and_mul(gate_up)
        out = self.down_proj(act)
        lora.add(out, act, "down_proj")
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelBackend) -> None:
        super().__init__()
        self.self_attn = Attention(config, ops)
        self.mlp = MLP(config, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
        lora: LayerLora | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        normed, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, normed, kv_cache, meta, cos_sin_cache, lora)
        normed, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(normed, lora), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelBackend) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, ops) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)


class LlamaForCausalLM(nn.Module):
    """Decoder plus LM head; `forward` gives hidden states, `compute_logits` the logits.

    Logits are computed only for the rows the sampler needs (the last token of
    each sequence whose chunk completes it), not for every prefill token.
    """

    def __init__(self, config: ModelConfig, ops: KernelBackend = REFERENCE) -> None:
        super().__init__()
        self.config = config
        self.ops = ops
        self.model = LlamaModel(config, ops)
        self.lm_head: nn.Linear | None = None
        if not config.tie_word_embeddings and not config.embedding_only:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.cos_sin_cache: torch.Tensor | None = None
        # the LM head's matmul; a fast_linears backend swaps in its own (engine/ops.py)
        self.head_linear: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.linear

    def init_rope(self, max_position: int) -> None:
        """Build the RoPE table on the weights' device (buffers are not in checkpoints)."""
        weight = self.model.embed_tokens.weight
        self.cos_sin_cache = build_rope_cache(
            self.config.head_dim,
            max_position,
            self.config.rope_theta,
            self.config.rope_scaling,
            torch.float32,
            weight.device,
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """`lora`: the step's adapter slots (engine/lora_batch.py); None runs the base model
        alone, the same code as without LoRA support."""
        if self.cos_sin_cache is None:
            raise RuntimeError("init_rope() must run before the first forward")
        hidden = self.model.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        for index, (layer, kv_cache) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            hidden, residual = layer(
                positions,
                hidden,
                residual,
                kv_cache,
                meta,
                self.cos_sin_cache,
                None if lora is None else lora.layer(index),
            )
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def head_weight(self) -> torch.Tensor:
        """The LM head's weight: its own, or the input embedding's when tied (Qwen2)."""
        if self.config.embedding_only:
            raise RuntimeError("an embedding-only model has no LM head")
        return self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head_linear(hidden, self.head_weight()).float()
