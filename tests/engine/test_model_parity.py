"""Hydrant's model against transformers on the same checkpoint files.

Logits are compared for a whole-prompt prefill, for a prefill split into
chunks whose later chunk reads the earlier one from the paged cache, and for
decode steps, so all three attention paths are held to transformers' numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_models import FAMILIES, Family, build_tiny_model, load_hf_model
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from hydrant.engine.attention import AttentionMetadata
from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import MissingWeightError, ModelLoadError, UnsupportedModelError
from hydrant.engine.loader import load_model
from hydrant.engine.model import LlamaForCausalLM
from hydrant.kernels.cpu.backend import PLANNED
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.rope_cache import build_rope_cache
from hydrant.kernels.table import KernelBackend

TOLERANCE = 1e-4
BLOCK = 16


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    dirs = {family: build_tiny_model(root / family, family) for family in FAMILIES}
    dirs["sharded"] = build_tiny_model(root / "sharded", "llama", max_shard_size="100KB")
    return dirs


def _load(
    model_dir: Path, dtype: torch.dtype = torch.float32, ops: KernelBackend = PLANNED
) -> LlamaForCausalLM:
    config = ModelConfig.from_pretrained(model_dir)
    return load_model(
        model_dir, config, "cpu", dtype, config.max_model_len, show_progress=False, ops=ops
    )


class PagedRun:
    """Feeds one sequence through the model chunk by chunk over a scattered block table."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int = 24) -> None:
        cfg = model.config
        dtype = model.model.embed_tokens.weight.dtype
        shape = (num_blocks, BLOCK, cfg.num_key_value_heads, cfg.head_dim)
        self.model = model
        self.caches = [
            (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
            for _ in range(cfg.num_hidden_layers)
        ]
        # a deliberately non-contiguous, out-of-order block table
        self.table = list(range(num_blocks - 1, 0, -2)) + list(range(0, num_blocks, 2))
        self.done = 0

    @torch.inference_mode()
    def feed(self, tokens: list[int]) -> torch.Tensor:
        start, end = self.done, self.done + len(tokens)
        positions = torch.arange(start, end)
        slots = torch.tensor(
            [self.table[p // BLOCK] * BLOCK + p % BLOCK for p in range(start, end)]
        )
        table = torch.tensor([self.table], dtype=torch.int32)
        ctx = torch.tensor([end], dtype=torch.int32)
        empty_table = torch.zeros((0, 1), dtype=torch.int32)
        empty = torch.zeros(0, dtype=torch.int32)
        if len(tokens) == 1:
            meta = AttentionMetadata(
                slots, 1, table, ctx, empty_table, torch.zeros(1, dtype=torch.int32), empty
            )
        else:
            cu = torch.tensor([0, len(tokens)], dtype=torch.int32)
            meta = AttentionMetadata(slots, 0, empty_table, empty, table, cu, ctx)
        hidden = self.model(torch.tensor(tokens), positions, self.caches, meta)
        self.done = end
        return self.model.compute_logits(hidden)


def _hf_logits(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return load_hf_model(model_dir)(torch.tensor([tokens])).logits[0]


def _tokens(n: int, seed: int = 0) -> list[int]:
    return torch.randint(0, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_prefill_logits_match_transformers(checkpoints: dict[str, Path], family: Family) -> None:
    tokens = _tokens(77)
    ours = PagedRun(_load(checkpoints[family])).feed(tokens)
    diff = (ours - _hf_logits(checkpoints[family], tokens)).abs().max().item()
    assert diff < TOLERANCE, f"{family}: max |Δlogit| = {diff}"


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_and_decode_logits_match(
    checkpoints: dict[str, Path], family: Family
) -> None:
    tokens = _tokens(60, seed=1)
    reference = _hf_logits(checkpoints[family], tokens)
    run = PagedRun(_load(checkpoints[family]))
    pieces = [run.feed(tokens[:23]), run.feed(tokens[23:50])]
    pieces += [run.feed([t]) for t in tokens[50:]]
    diff = (torch.cat(pieces) - reference).abs().max().item()
    assert diff < TOLERANCE, f"{family}: max |Δlogit| = {diff}"


@pytest.mark.parametrize("family", ["gqa", "qwen2"])
def test_kernel_package_ops_match_too(checkpoints: dict[str, Path], family: Family) -> None:
    tokens = _tokens(50, seed=4)
    reference = _hf_logits(checkpoints[family], tokens)
    run = PagedRun(_load(checkpoints[family], ops=REFERENCE))
    pieces = [run.feed(tokens[:30]), run.feed(tokens[30:45])]
    pieces += [run.feed([t]) for t in tokens[45:]]
    diff = (torch.cat(pieces) - reference).abs().max().item()
    assert diff < TOLERANCE, f"{family}: max |Δlogit| = {diff}"


def test_sharded_checkpoint_loads_the_same_logits(
    checkpoints: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    index = json.loads((checkpoints["sharded"] / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1
    tokens = _tokens(40, seed=2)
    with caplog.at_level(logging.INFO, logger="hydrant.engine.loader"):
        sharded = PagedRun(_load(checkpoints["sharded"])).feed(tokens)
    assert f"loaded shard {len(shards)}/{len(shards)}" in caplog.text
    single = PagedRun(_load(checkpoints["llama"])).feed(tokens)
    assert torch.equal(sharded, single)
    assert (sharded - _hf_logits(checkpoints["sharded"], tokens)).abs().max().item() < TOLERANCE


def test_llama3_rope_table_matches_transformers() -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    hf_config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=256,
        rope_parameters={**scaling, "rope_theta": 500000.0},
    )
    ours = build_rope_cache(16, 256, 500000.0, scaling, torch.float32, "cpu")
    plain = build_rope_cache(16, 256, 500000.0, None, torch.float32, "cpu")
    x = torch.zeros(1, 256, 16)
    cos, sin = LlamaRotaryEmbedding(hf_config)(x, torch.arange(256)[None])
    reference = torch.cat((cos[0, :, :8], sin[0, :, :8]), dim=-1)
    assert (ours - reference).abs().max().item() < 1e-6
    assert (plain - reference).abs().max().item() > 1e-2  # the scaling did change frequencies


def test_qwen2_reads_tied_embeddings_and_qkv_bias(checkpoints: dict[str, Path]) -> None:
    model = _load(checkpoints["qwen2"])
    assert model.lm_head is None
    bias = model.model.layers[0].self_attn.qkv_proj.bias
    assert bias is not None and bias.abs().sum().item() > 0


def test_bfloat16_load_keeps_dtype_and_stays_close(checkpoints: dict[str, Path]) -> None:
    model = _load(checkpoints["llama"], torch.bfloat16)
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    tokens = _tokens(30, seed=3)
    ours = PagedRun(model).feed(tokens)
    reference = _hf_logits(checkpoints["llama"], tokens)
    assert (ours - reference).abs().max().item() < 0.1


def test_missing_tensor_is_named(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json"):
        (broken / name).write_bytes((checkpoints["llama"] / name).read_bytes())
    weights = load_file(str(checkpoints["llama"] / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(MissingWeightError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight"):
        _load(broken)


def test_unsupported_architecture_and_rope_type_are_refused(tmp_path: Path) -> None:
    base = json.loads(LlamaConfig(hidden_size=64, num_attention_heads=4).to_json_string())
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel"):
        ModelConfig.from_dict({**base, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_dict(
            {
                **base,
                "architectures": ["LlamaForCausalLM"],
                "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
            }
        )
    with pytest.raises(ModelLoadError, match="no safetensors"):
        (tmp_path / "config.json").write_text(
            json.dumps({**base, "architectures": ["LlamaForCausalLM"]})
        )
        _load(tmp_path)
