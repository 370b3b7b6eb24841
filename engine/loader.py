"""Load a Hugging Face safetensors checkpoint into `LlamaForCausalLM`.

The gpt-fast way: build the module on the `meta` device (no memory, no random
init), read each tensor by memory map straight onto the target device, and
hand the finished state dict to `load_state_dict(assign=True)`, so weights
are touched once. Sharded checkpoints are read shard by shard through
`model.safetensors.index.json`; fused parameters (qkv, gate_up) are assembled
as soon as their last part is read, even when parts straddle shards.
Nothing is ever downloaded: the directory is all there is.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import MissingWeightError, ModelLoadError
from hydrant.engine.model import LlamaForCausalLM
from hydrant.engine.ops import TORCH_OPS, KernelOps

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


def _target_name(name: str, config: ModelConfig) -> tuple[str, int] | None:
    """Map a checkpoint name to (parameter name, fused part index or -1); None = skip."""
    if _IGNORED.search(name):
        return None
    if name == "lm_head.weight" and config.tie_word_embeddings:
        return None
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
    ops: KernelOps = TORCH_OPS,
) -> LlamaForCausalLM:
    """Build on `meta`, fill from the checkpoint by memory map, return in eval mode."""
    with torch.device("meta"):
        model = LlamaForCausalLM(config, ops)
    expected = {name: tuple(p.shape) for name, p in model.state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    pending: dict[str, dict[int, torch.Tensor]] = {}
    files = checkpoint_files(model_dir)
    open_device = str(device) if str(device).startswith("cuda") else "cpu"
    bar = tqdm(
        files,
        desc="loading weights",
        unit="shard",
        file=sys.stderr,
        disable=not (show_progress and sys.stderr.isatty()),
    )
    for number, path in enumerate(bar, start=1):
        count = 0
        with safe_open(str(path), framework="pt", device=open_device) as reader:
            for name in reader.keys():  # noqa: SIM118 - safe_open is not a Mapping
                target = _target_name(name, config)
                if target is None:
                    continue
                param, part = target
                if param not in expected:
                    logger.warning("ignoring unexpected checkpoint tensor %s", name)
                    continue
                tensor = reader.get_tensor(name).to(device=device, dtype=dtype)
                count += 1
                if part < 0:
                    state[param] = tensor
                    continue
                parts = pending.setdefault(param, {})
                parts[part] = tensor
                if len(parts) == _FUSED_PARTS[param.rsplit(".", 2)[-2]]:
                    state[param] = torch.cat([parts[i] for i in sorted(parts)], dim=0)
                    del pending[param]
        logger.info("loaded shard %d/%d %s (%d tensors)", number, len(files), path.name, count)
    _check_complete(expected, state, pending)
    model.load_state_dict(state, assign=True, strict=True)
    model.init_rope(max_position)
    return model.eval()


def _check_complete(
    expected: dict[str, tuple[int, ...]],
    state: dict[str, torch.Tensor],
    pending: dict[str, dict[int, torch.Tensor]],
) -> None:
    missing = sorted(set(expected) - set(state))
    if missing:
        partial = {name: sorted(parts) for name, parts in pending.items()}
        shown = ", ".join(missing[:8]) + (" …" if len(missing) > 8 else "")
        detail = f" (fused parameters with only parts {partial})" if partial else ""
        raise MissingWeightError(f"checkpoint lacks {len(missing)} tensor(s): {shown}{detail}")
    for name, shape in expected.items():
        if tuple(state[name].shape) != shape:
            raise MissingWeightError(
                f"tensor {name} has shape {tuple(state[name].shape)}, the config implies {shape}"
            )
