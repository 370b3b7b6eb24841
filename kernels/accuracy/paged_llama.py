"""A minimal paged Llama forward built only from `hydrant.kernels.ops`.

It exists to measure what the ops do inside a real transformer: the float
path must reproduce the HF model's logits (every op composed, rope and GQA
included), and the int8-KV path is compared against it for the accuracy
gate. It runs each sequence as chunked prefill (several chunks, the later
ones attending to earlier chunks in the cache) followed by teacher-forced
decode steps over a batch of mixed lengths, so prefill-over-cache and decode
over int8 caches are both on the measured path. It is not the engine:
blocks are assigned once (shuffled, so tables are not contiguous), there
is no scheduler and no sampling.

The model needs the HF Llama structure and config attribute names; its
linears may be `nn.Linear` or `QuantizedLinear`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hydrant.kernels import ops
from hydrant.kernels.backends import BackendName
from hydrant.kernels.errors import KernelArgumentError


def _rope_settings(config: Any) -> tuple[float, dict[str, Any] | None]:
    params = getattr(config, "rope_parameters", None) or {}
    theta = getattr(config, "rope_theta", None) or params.get("rope_theta", 10000.0)
    scaling = getattr(config, "rope_scaling", None) or params or None
    if scaling and scaling.get("rope_type", scaling.get("type")) == "default":
        scaling = None
    return float(theta), scaling


class PagedLlama:
    """Runs a Llama-structured `model` through the kernel ops over a paged KV cache."""

    def __init__(
        self,
        model: Any,
        *,
        block_size: int = 16,
        kv_cache_dtype: torch.dtype | str = torch.float32,
        max_tokens: int = 1024,
        backend: BackendName | None = None,
        seed: int = 0,
    ) -> None:
        config = model.config
        self.model: Any = model  # duck-typed: the HF Llama attribute tree
        self.backend, self.block_size = backend, block_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = float(config.rms_norm_eps)
        device = model.lm_head.weight.device
        self.dtype = model.model.embed_tokens.weight.dtype
        theta, scaling = _rope_settings(config)
        self.rope = ops.build_rope_cache(
            self.head_dim, config.max_position_embeddings, theta, scaling, self.dtype, device
        )
        self.num_blocks = -(-max_tokens // block_size) + 1
        self.int8 = kv_cache_dtype in ("int8", torch.int8)
        if isinstance(kv_cache_dtype, torch.dtype):
            cache_dtype = kv_cache_dtype
        elif self.int8:
            cache_dtype = torch.int8
        else:
            raise KernelArgumentError(f"kv_cache_dtype must be a dtype or 'int8': {kv_cache_dtype}")
        shape = (self.num_blocks, block_size, self.num_kv_heads, self.head_dim)
        layers = len(model.model.layers)
        self.k_caches = [
            torch.zeros(shape, dtype=cache_dtype, device=device) for _ in range(layers)
        ]
        self.v_caches = [
            torch.zeros(shape, dtype=cache_dtype, device=device) for _ in range(layers)
        ]
        scale_shape = shape[:3]
        self.k_scales = [
            torch.zeros(scale_shape, device=device) if self.int8 else None for _ in range(layers)
        ]
        self.v_scales = [
            torch.zeros(scale_shape, device=device) if self.int8 else None for _ in range(layers)
        ]
        gen = torch.Generator().manual_seed(seed)
        self.free_blocks = torch.randperm(self.num_blocks, generator=gen).tolist()
        self.device: torch.device = device

    def _layer(
        self,
        i: int,
        h: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        slots: torch.Tensor,
        attend: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.model.model.layers[i]
        attn, mlp, t = layer.self_attn, layer.mlp, h.shape[0]
        x, residual = ops.rms_norm(
            h, layer.input_layernorm.weight, self.eps, residual, backend=self.backend
        )
        q = attn.q_proj(x).view(t, self.num_heads, self.head_dim)
        k = attn.k_proj(x).view(t, self.num_kv_heads, self.head_dim)
        v = attn.v_proj(x).view(t, self.num_kv_heads, self.head_dim)
        q, k = ops.rotary_embedding(positions, q, k, self.rope, backend=self.backend)
        ops.write_kv(
            k,
            v,
            self.k_caches[i],
            self.v_caches[i],
            slots,
            self.k_scales[i],
            self.v_scales[i],
            backend=self.backend,
        )
        out = attend(q, self.k_caches[i], self.v_caches[i], self.k_scales[i], self.v_scales[i])
        h = attn.o_proj(out.reshape(t, self.num_heads * self.head_dim))
        x, residual = ops.rms_norm(
            h, layer.post_attention_layernorm.weight, self.eps, residual, backend=self.backend
        )
        gate_up = torch.cat((mlp.gate_proj(x), mlp.up_proj(x)), dim=-1)
        return mlp.down_proj(ops.silu_and_mul(gate_up, backend=self.backend)), residual

    def _step(
        self, chunks: list[list[int]], starts: list[int], tables: torch.Tensor, decode: bool
    ) -> torch.Tensor:
        """One batched forward of `chunks[b]` placed at positions `starts[b]...`; logits [T, V]."""
        ids, positions, slots = [], [], []
        for b, (chunk, start) in enumerate(zip(chunks, starts, strict=True)):
            for j, token in enumerate(chunk):
                pos = start + j
                ids.append(token)
                positions.append(pos)
                slots.append(
                    int(tables[b, pos // self.block_size]) * self.block_size + pos % self.block_size
                )
        dev = self.device
        positions_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        slots_t = torch.tensor(slots, dtype=torch.int64, device=dev)
        lens = torch.tensor(
            [s + len(c) for s, c in zip(starts, chunks, strict=True)], dtype=torch.int32, device=dev
        )
        cu = torch.tensor(
            [0, *torch.tensor([len(c) for c in chunks]).cumsum(0).tolist()],
            dtype=torch.int32,
            device=dev,
        )
        tables_t = tables.to(dev)
        scale = self.head_dim**-0.5

        def attend(
            q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, ks: Any, vs: Any
        ) -> torch.Tensor:
            if decode:
                return ops.paged_decode_attention(
                    q, kc, vc, tables_t, lens, scale, k_scale=ks, v_scale=vs, backend=self.backend
                )
            return ops.paged_prefill_attention(
                q,
                kc,
                vc,
                tables_t,
                cu,
                lens,
                scale,
                k_scale=ks,
                v_scale=vs,
                max_seqlen_q=max(map(len, chunks)),
                backend=self.backend,
            )

        core = self.model.model
        h = core.embed_tokens(torch.tensor(ids, device=dev))
        residual = None
        for i in range(len(core.layers)):
            h, residual = self._layer(i, h, residual, positions_t, slots_t, attend)
        h, _ = ops.rms_norm(h, core.norm.weight, self.eps, residual, backend=self.backend)
        logits: torch.Tensor = self.model.lm_head(h)
        return logits

    @torch.no_grad()
    def logits(
        self, sequences: Sequence[Sequence[int]], prefill_lengths: Sequence[int], chunk: int
    ) -> list[torch.Tensor]:
        """Logits `[len, V]` at every position of every sequence.

        Sequence b's first `prefill_lengths[b]` tokens are prefilled in chunks of
        `chunk` (batched with the others still prefilling); its remaining tokens
        are then decoded one per step, batched with every sequence still going,
        so decode batches mix context lengths.
        """
        lengths = [len(s) for s in sequences]
        if (
            len(prefill_lengths) != len(sequences)
            or chunk <= 0
            or not sequences
            or any(not 0 < p <= n for p, n in zip(prefill_lengths, lengths, strict=True))
        ):
            raise KernelArgumentError("need 0 < prefill_lengths[b] <= len(sequences[b]), chunk > 0")
        per_seq = -(-max(lengths) // self.block_size)
        if per_seq * len(sequences) > len(self.free_blocks):
            raise KernelArgumentError("the cache is too small for these sequences")
        tables = torch.tensor(
            [self.free_blocks[b * per_seq : (b + 1) * per_seq] for b in range(len(sequences))],
            dtype=torch.int32,
        )
        outputs: list[list[torch.Tensor]] = [[] for _ in sequences]
        cursor = [0] * len(sequences)
        while any(c < n for c, n in zip(cursor, lengths, strict=True)):
            prefilling = [b for b, c in enumerate(cursor) if c < prefill_lengths[b]]
            decode = not prefilling
            active = prefilling or [b for b, c in enumerate(cursor) if c < lengths[b]]
            ends = [
                cursor[b] + 1 if decode else min(cursor[b] + chunk, prefill_lengths[b])
                for b in active
            ]
            chunks = [
                list(sequences[b][cursor[b] : end]) for b, end in zip(active, ends, strict=True)
            ]
            out = self._step(chunks, [cursor[b] for b in active], tables[active], decode)
            for b, piece, end in zip(
                active, out.split([len(c) for c in chunks]), ends, strict=True
            ):
                outputs[b].append(piece)
                cursor[b] = end
        return [torch.cat(parts) for parts in outputs]
