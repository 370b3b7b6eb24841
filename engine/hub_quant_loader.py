"""Load an AWQ, GPTQ or compressed-tensors checkpoint into the engine's quantized linears.

The float parts (embeddings, norms, head, biases, any linear the checkpoint
keeps in float) are read by the engine's own loader, straight into their final
tensors; each quantized projection's packed tensors are read as they are
stored, repacked once into Hydrant's W4A16 / W8A16 layout by its format's
reader (`hydrant.kernels.quantization.hub_*`), and q/k/v and gate/up are
concatenated along the output dimension into the engine's fused modules.
After that the model is indistinguishable from one loaded from a
`hydrant models quantize` checkpoint: same `QuantizedLinear`, same kernels.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import MissingWeightError, ModelLoadError
from hydrant.engine.hub_quant_config import HubQuantization
from hydrant.engine.load_report import timed_phase
from hydrant.engine.loader import checkpoint_tensor_names, read_state
from hydrant.engine.model import LlamaForCausalLM
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.hub_awq import AWQ_TENSORS, repack_awq_gemm
from hydrant.kernels.quantization.hub_compressed_tensors import (
    PACKED_TENSORS,
    repack_pack_quantized,
)
from hydrant.kernels.quantization.hub_gptq import (
    GPTQ_TENSORS,
    V1_ZERO_OFFSET,
    V2_ZERO_OFFSET,
    repack_gptq,
)
from hydrant.kernels.quantization.hub_repack import RepackedWeight, fuse_rows, quantized_linear
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.table import KernelBackend

logger = logging.getLogger(__name__)

# checkpoint projection -> (engine module, part index, parts of that module)
_PROJECTIONS = {
    "q_proj": ("qkv_proj", 0, 3),
    "k_proj": ("qkv_proj", 1, 3),
    "v_proj": ("qkv_proj", 2, 3),
    "o_proj": ("o_proj", 0, 1),
    "gate_proj": ("gate_up_proj", 0, 2),
    "up_proj": ("gate_up_proj", 1, 2),
    "down_proj": ("down_proj", 0, 1),
}
_PROJECTION = re.compile(r"^(.*)\.(" + "|".join(_PROJECTIONS) + r")$")
# the tensor whose presence marks a module as quantized, and every tensor the format stores
_MARKER = {"awq": "qweight", "gptq": "qweight", "compressed-tensors": "weight_packed"}
_TENSORS = {"awq": AWQ_TENSORS, "gptq": GPTQ_TENSORS, "compressed-tensors": PACKED_TENSORS}


def load_hub_model(
    model_dir: Path,
    model_config: ModelConfig,
    hub: HubQuantization,
    device: str,
    dtype: torch.dtype,
    max_model_len: int,
    show_progress: bool = False,
    ops: KernelBackend = REFERENCE,
) -> LlamaForCausalLM:
    """Build on `meta`, read float tensors and packed codes, repack, fuse, assign."""
    names = checkpoint_tensor_names(model_dir)
    plan = _plan(names, hub)
    with timed_phase("build_meta"), torch.device("meta"):
        model = LlamaForCausalLM(model_config, ops)
    expected = {
        name: tuple(p.shape)
        for name, p in model.state_dict().items()
        if name.removesuffix(".weight") not in plan
    }
    quantized = {part for parts in plan.values() for part in parts}
    stored = set(_TENSORS[hub.method])
    raw: dict[str, torch.Tensor] = {}

    def is_packed(name: str) -> bool:
        module, _, tensor = name.rpartition(".")
        return tensor in stored and module in quantized

    with timed_phase("read_weights"):
        state = read_state(
            model_dir, model_config, device, dtype, expected, show_progress, is_packed, raw
        )
    with timed_phase("repack"):
        for name, parts in plan.items():
            weight = fuse_rows([_repack(hub, raw, part) for part in parts])
            for key in [key for key in raw if key.rpartition(".")[0] in parts]:
                del raw[key]  # the packed copy goes as soon as its repacked one exists
            try:
                current = model.get_submodule(name)
            except AttributeError as exc:
                raise ModelLoadError(f"the quantized {parts} have no {name} in the model") from exc
            if not isinstance(current, nn.Linear):
                raise ModelLoadError(f"{name} is a {type(current).__name__}, not a linear")
            shape = (weight.in_features, weight.out_features)
            if shape != (current.in_features, current.out_features):
                raise MissingWeightError(
                    f"{name}: the checkpoint's quantized weight is {shape[0]}->{shape[1]}, "
                    f"the config implies {current.in_features}->{current.out_features}"
                )
            module = quantized_linear(weight, state.pop(f"{name}.bias", None), dtype)
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, module)
            state.update({f"{name}.{key}": t for key, t in module.state_dict().items()})
    with timed_phase("assign"):
        model.load_state_dict(state, assign=True, strict=True)
        model.init_rope(max_model_len)
    logger.info(
        "loaded %s checkpoint %s: %d linears repacked to Hydrant's %s layout",
        hub.describe(),
        Path(model_dir).name,
        len(plan),
        hub.mode,
    )
    return model.eval()


def _plan(names: set[str], hub: HubQuantization) -> dict[str, list[str]]:
    """Engine module -> its checkpoint modules in part order, for every quantized projection.

    Refuses quantized modules the engine keeps in float (the head), modules the
    checkpoint both quantizes and lists as float, and fused modules whose parts
    are not all quantized (their codes would have to share one module).
    """
    marker = "." + _MARKER[hub.method]
    found = sorted(name.removesuffix(marker) for name in names if name.endswith(marker))
    if not found:
        raise ModelLoadError(
            f"quantization_config says {hub.method}, but no tensor is named *{marker}"
        )
    parts: dict[str, dict[int, str]] = {}
    sizes: dict[str, int] = {}
    for module in found:
        match = _PROJECTION.match(module)
        if match is None:
            raise ModelLoadError(
                f"{module} is quantized in the checkpoint; Hydrant serves quantized decoder "
                f"projections only ({', '.join(_PROJECTIONS)})"
            )
        if hub.keeps_float(module):
            raise ModelLoadError(
                f"{module} is quantized in the checkpoint but listed as not converted by its "
                "quantization_config"
            )
        prefix, projection = match.groups()
        target, index, count = _PROJECTIONS[projection]
        engine_name = f"{prefix}.{target}"
        parts.setdefault(engine_name, {})[index] = module
        sizes[engine_name] = count
    plan: dict[str, list[str]] = {}
    for engine_name, by_index in parts.items():
        if len(by_index) != sizes[engine_name]:
            raise ModelLoadError(
                f"{engine_name} fuses {sizes[engine_name]} projections but only "
                f"{sorted(by_index.values())} are quantized in the checkpoint; Hydrant needs "
                "all of them quantized alike, or none"
            )
        plan[engine_name] = [by_index[i] for i in range(sizes[engine_name])]
    return plan


def _repack(hub: HubQuantization, raw: Mapping[str, torch.Tensor], module: str) -> RepackedWeight:
    """One checkpoint module's packed tensors in Hydrant's layout (its format's reader)."""

    def tensor(name: str) -> torch.Tensor:
        found = raw.get(f"{module}.{name}")
        if found is None:
            raise MissingWeightError(f"{module} is quantized but the checkpoint lacks its {name}")
        return found

    try:
        if hub.method == "awq":
            return repack_awq_gemm(
                tensor("qweight"), tensor("qzeros"), tensor("scales"), hub.group_size
            )
        if hub.method == "gptq":
            return repack_gptq(
                tensor("qweight"),
                tensor("qzeros"),
                tensor("scales"),
                raw.get(f"{module}.g_idx"),
                hub.group_size,
                V2_ZERO_OFFSET if hub.checkpoint_format == "gptq_v2" else V1_ZERO_OFFSET,
            )
        # a symmetric scheme's zero points are 0 (older library versions still stored them)
        zero_point = None if hub.symmetric else tensor("weight_zero_point")
        return repack_pack_quantized(
            tensor("weight_packed"),
            tensor("weight_scale"),
            tensor("weight_shape"),
            zero_point,
            hub.bits,
        )
    except KernelArgumentError as exc:
        raise ModelLoadError(f"cannot load {hub.method} weights of {module}: {exc}") from exc
