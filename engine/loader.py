"""Load a Hugging Face safetensors checkpoint into `LlamaForCausalLM`.

The gpt-fast way: build the module on the `meta` device (no memory, no random
init), read each tensor straight into its final tensor, and hand the finished
state dict to `load_state_dict(assign=True)`, so weights are touched once.
Sharded checkpoints are read shard by shard through
`model.safetensors.index.json`; a fused parameter (qkv, gate_up) is allocated
whole and each checkpoint part is read into its own rows, even when parts
straddle shards. Nothing is ever downloaded: the directory is all there is.

The bytes are read with `preadv` (safetensors_reader.py) after a WILLNEED
hint, not through a memory map: the weights then live in process memory and
never depend on the file again (a sleeping worker wakes without touching the
disk; a checkpoint rewritten in place cannot SIGBUS a running worker), a cold
load really reads every byte instead of deferring reads to the first forward,
and the one copy is the kernel's, page cache to tensor. The phases
(`build_meta`, `read_weights`, `assign`) are timed into the active
`LoadReport`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import MissingWeightError, ModelLoadError
from hydrant.engine.load_report import timed_phase
from hydrant.engine.model import LlamaForCausalLM
from hydrant.engine.page_cache import advise_willneed
from hydrant.engine.safetensors_reader import SafetensorsFile, TensorEntry
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.table import KernelBackend

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

# checkpoint projection -> (fused parameter, index of its part)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_FUSED_PARTS = {"qkv_proj": 3, "gate_up_proj": 2}
_FUSED_NAME = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint, in the order the index lists them."""
    model_dir = Path(model_dir)
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        names = list(dict.fromkeys(weight_map.values()))
        files = [model_dir / name for name in names]
        absent = [str(f.name) for f in files if not f.is_file()]
        if absent:
            raise ModelLoadError(f"shards listed in {INDEX_FILE} are missing: {absent}")
        return files
    single = model_dir / SINGLE_FILE
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if not found:
        raise ModelLoadError(f"no safetensors weights in {model_dir} (nothing is downloaded)")
    return found


def checkpoint_tensor_names(model_dir: Path) -> set[str]:
    """Every tensor name of a checkpoint, from its index or its shards' headers (no data)."""
    index = Path(model_dir) / INDEX_FILE
    if index.is_file():
        return set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
    names: set[str] = set()
    for path in checkpoint_files(model_dir):
        with SafetensorsFile(path) as reader:
            names.update(entry.name for entry in reader.entries)
    return names


def read_model_config(model_dir: Path) -> ModelConfig:
    """`config.json`, corrected by what the weights hold.

    Embedding models built on a causal LM often say `*ForCausalLM` in `config.json` but
    ship the bare decoder's weights (Qwen3-Embedding: names without `model.`, no
    `lm_head`), as transformers' `AutoModel` saves them; vLLM loads both layouts. Such a
    checkpoint with untied embeddings has no head to generate with, so it is served for
    embeddings only, instead of failing on a missing `lm_head.weight`.
    """
    config = ModelConfig.from_pretrained(model_dir)
    if config.embedding_only or config.tie_word_embeddings:
        return config
    if any(name.startswith("lm_head.") for name in checkpoint_tensor_names(model_dir)):
        return config
    logger.info(
        "%s has no lm_head and untied embeddings: serving it for embeddings only",
        Path(model_dir).name,
    )
    return dataclasses.replace(config, embedding_only=True)


def _target_name(name: str, config: ModelConfig) -> tuple[str, int] | None:
    """Map a checkpoint name to (parameter name, fused part index or -1); None = skip."""
    if _IGNORED.search(name):
        return None
    if name == "lm_head.weight" and (config.tie_word_embeddings or config.embedding_only):
        return None
    if not name.startswith(("model.", "lm_head.")):
        name = "model." + name  # a bare decoder's names lack the causal LM's prefix
    match = _FUSED_NAME.match(name)
    if match is None:
        return name, -1
    prefix, proj, kind = match.groups()
    fused, part = _FUSED[proj]
    return f"{prefix}.{fused}.{kind}", part


def load_model(
    model_dir: Path,
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    max_position: int,
    show_progress: bool = True,
    ops: KernelBackend = REFERENCE,
) -> LlamaForCausalLM:
    """Build on `meta`, fill from the checkpoint by memory map, return in eval mode."""
    with timed_phase("build_meta"), torch.device("meta"):
        model = LlamaForCausalLM(config, ops)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    with timed_phase("read_weights"):
        state = read_state(model_dir, config, device, dtype, expected, show_progress)
    with timed_phase("assign"):
        model.load_state_dict(state, assign=True, strict=True)
        model.init_rope(max_position)
    return model.eval()


def unfused_parts(config: ModelConfig) -> dict[str, list[tuple[str, int]]]:
    """Each fused parameter's checkpoint projections and their rows, in row order.

    The inverse of loading: `{"qkv_proj": [("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
    "gate_up_proj": [...]}`, for writers that give other tools the Hugging Face names back.
    """
    rows = _part_rows(config)
    parts: dict[str, list[tuple[str, int]]] = {}
    for proj, (fused, index) in sorted(_FUSED.items(), key=lambda item: item[1]):
        parts.setdefault(fused, []).append((proj, rows[fused][index]))
    return parts


def _part_rows(config: ModelConfig) -> dict[str, list[int]]:
    """Rows of each part inside a fused parameter, in part order (dim 0 is the output)."""
    q = config.num_attention_heads * config.head_dim
    kv = config.num_key_value_heads * config.head_dim
    return {
        "qkv_proj": [q, kv, kv],
        "gate_up_proj": [config.intermediate_size, config.intermediate_size],
    }


def read_state(
    model_dir: Path,
    config: ModelConfig,
    device: torch.device | str,
    dtype: torch.dtype,
    expected: dict[str, tuple[int, ...]],
    show_progress: bool,
    raw: Callable[[str], bool] | None = None,
    raw_state: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Every parameter of the model, read shard by shard straight into its final tensor.

    A fused parameter is allocated whole when its first part arrives and each
    part is read into its own rows, so q/k/v and gate/up are never concatenated.
    Tensors whose checkpoint name `raw` accepts (a hub checkpoint's packed codes,
    which need repacking) go to `raw_state` under that name, in their stored
    dtype, on `device`.
    """
    state: dict[str, torch.Tensor] = {}
    parts_seen: dict[str, set[int]] = {}
    rows = _part_rows(config)
    files = checkpoint_files(model_dir)
    bar = tqdm(
        total=sum(f.stat().st_size for f in files),
        desc="loading weights",
        unit="B",
        unit_scale=True,
        file=sys.stderr,
        disable=not (show_progress and sys.stderr.isatty()),
    )
    for number, path in enumerate(files, start=1):
        count = 0
        advise_willneed(path)
        with SafetensorsFile(path) as reader:
            for entry in reader.entries:
                bar.update(entry.nbytes)
                if raw is not None and raw_state is not None and raw(entry.name):
                    raw_state[entry.name] = reader.read(entry).to(device)
                    count += 1
                    continue
                target = _target_name(entry.name, config)
                if target is None:
                    continue
                param, part = target
                if param not in expected:
                    logger.warning("ignoring unexpected checkpoint tensor %s", entry.name)
                    continue
                if param not in state:
                    state[param] = torch.empty(expected[param], dtype=dtype, device=device)
                dest = state[param]
                if part >= 0:
                    sizes = rows[param.rsplit(".", 2)[-2]]
                    start = sum(sizes[:part])
                    dest = dest[start : start + sizes[part]]
                if entry.shape != tuple(dest.shape):
                    raise MissingWeightError(
                        f"tensor {entry.name} has shape {entry.shape}, "
                        f"the config implies {tuple(dest.shape)}"
                    )
                _fill(reader, entry, dest)
                parts_seen.setdefault(param, set()).add(part)
                count += 1
        logger.info("loaded shard %d/%d %s (%d tensors)", number, len(files), path.name, count)
    bar.close()
    _check_complete(expected, state, parts_seen)
    return state


def _fill(reader: SafetensorsFile, entry: TensorEntry, dest: torch.Tensor) -> None:
    """Read into `dest` directly when it is host memory of the file's dtype, else convert."""
    if dest.device.type == "cpu" and dest.dtype == entry.dtype:
        reader.read_into(entry, dest)
    else:
        dest.copy_(reader.read(entry))


def _check_complete(
    expected: dict[str, tuple[int, ...]],
    state: dict[str, torch.Tensor],
    parts_seen: dict[str, set[int]],
) -> None:
    """Every parameter read in full: a whole tensor, or every part of a fused one."""

    def complete(name: str) -> bool:
        seen = parts_seen.get(name, set())
        if -1 in seen:
            return True
        fused = name.rsplit(".", 2)[-2]
        return fused in _FUSED_PARTS and seen == set(range(_FUSED_PARTS[fused]))

    missing = sorted(name for name in expected if not complete(name))
    if missing:
        partial = {name: sorted(parts_seen[name]) for name in missing if name in parts_seen}
        shown = ", ".join(missing[:8]) + (" …" if len(missing) > 8 else "")
        detail = f" (fused parameters with only parts {partial})" if partial else ""
        raise MissingWeightError(f"checkpoint lacks {len(missing)} tensor(s): {shown}{detail}")
