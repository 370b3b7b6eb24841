"""Weight-only quantization for the engine: quantize on load, or load a quantized checkpoint.

Two ways in, one result (a model whose linears are `QuantizedLinear`):

- a float checkpoint plus `EngineConfig.quantization`: the float model is
  loaded as usual and `quantize_model` transforms it in place (gpt-fast's
  rule: the mode is an explicit option, never guessed from a file name);
- a directory written by `hydrant models quantize` (it holds a Hydrant
  quantization manifest): the model is built with empty `QuantizedLinear`
  modules and the stored codes are loaded as they are, so a server start
  never pays for quantization and every replica serves identical weights;
- a hub checkpoint whose `config.json` declares an AWQ, GPTQ or
  compressed-tensors `quantization_config`: its codes are repacked once into
  the same layouts (`engine/hub_quant_loader.py`).

The checkpoint keeps the engine's own parameter names (fused `qkv_proj`,
`gate_up_proj`), so it loads as is. `quantize_checkpoint` can instead write
the same codes as a compressed-tensors checkpoint in the Hugging Face layout,
for vLLM and transformers (`hydrant.engine.compressed_tensors_export`).
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch

from hydrant.engine.compressed_tensors_export import save_compressed_tensors
from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import EngineConfig, EngineConfigError
from hydrant.engine.errors import ModelLoadError
from hydrant.engine.hub_quant_config import read_hub_quantization
from hydrant.engine.hub_quant_loader import load_hub_model
from hydrant.engine.loader import INDEX_FILE, load_model, read_model_config
from hydrant.engine.model import LlamaForCausalLM
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization import (
    QuantizationManifest,
    QuantizationMode,
    QuantizationReport,
    load_quantized,
    quantize_model,
    read_quantization_manifest,
    save_quantized,
)
from hydrant.kernels.quantization.footprint import module_bytes
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.table import KernelBackend

logger = logging.getLogger(__name__)

# What `hydrant models quantize --format` writes: the engine's own layout, or compressed-tensors.
CheckpointFormat = Literal["hydrant", "compressed-tensors"]
CHECKPOINT_FORMATS: tuple[CheckpointFormat, ...] = ("hydrant", "compressed-tensors")

# Files of a float checkpoint that a quantized copy must not carry over.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def load_engine_model(
    model_dir: Path,
    model_config: ModelConfig,
    config: EngineConfig,
    dtype: torch.dtype,
    max_model_len: int,
    ops: KernelBackend = REFERENCE,
) -> LlamaForCausalLM:
    """The model the engine runs: float, quantized on load, or read already quantized."""
    hub = read_hub_quantization(model_dir)
    if hub is not None:
        if config.quantization not in (None, hub.mode):
            raise EngineConfigError(
                f"{model_dir} is a {hub.describe()} checkpoint; it cannot be served as "
                f"quantization={config.quantization!r}"
            )
        return load_hub_model(
            model_dir, model_config, hub, config.device, dtype, max_model_len, ops=ops
        )
    manifest = read_quantization_manifest(model_dir)
    if manifest is not None:
        if config.quantization not in (None, manifest.mode):
            raise EngineConfigError(
                f"{model_dir} is quantized {manifest.mode}; it cannot be served as "
                f"quantization={config.quantization!r} (use the float checkpoint)"
            )
        return load_quantized_model(
            model_dir, model_config, manifest, config.device, dtype, max_model_len, ops
        )
    model = load_model(
        model_dir, model_config, config.device, dtype, max_model_len, config.show_progress, ops
    )
    if config.quantization is not None:
        log_report(quantize_model(model, config.quantization))
    return model


def load_quantized_model(
    model_dir: Path,
    model_config: ModelConfig,
    manifest: QuantizationManifest,
    device: str,
    dtype: torch.dtype,
    max_model_len: int,
    ops: KernelBackend = REFERENCE,
) -> LlamaForCausalLM:
    """Build empty, swap in `QuantizedLinear` shells, read the stored codes (no quantizing)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(model_config, ops)
    model.to_empty(device=device)
    try:
        load_quantized(model, model_dir, device)
    except KernelArgumentError as exc:
        raise ModelLoadError(f"cannot load quantized checkpoint {model_dir}: {exc}") from exc
    model.to(dtype)  # float tensors and scales only; the int8/uint8 codes keep their dtype
    model.init_rope(max_model_len)
    logger.info(
        "loaded %s checkpoint without re-quantizing: %d quantized linears, %d weight bytes",
        manifest.mode,
        len(manifest.modules),
        module_bytes(model),
    )
    return model.eval()


def log_report(report: QuantizationReport) -> None:
    """Log what quantization saved; operators size pools by these numbers."""
    logger.info(
        "quantized weights to %s: %d linears (%d left in float), linear bytes %d -> %d, "
        "model bytes %d -> %d",
        report.mode,
        len(report.quantized),
        len(report.skipped),
        report.bytes_before,
        report.bytes_after,
        report.model_bytes_before,
        report.model_bytes_after,
    )


def quantize_checkpoint(
    src: Path,
    dst: Path,
    mode: QuantizationMode,
    progress: Callable[[str], None] = lambda _: None,
    checkpoint_format: CheckpointFormat = "hydrant",
) -> QuantizationReport:
    """Write a quantized copy of the float checkpoint `src` to `dst` (offline, on CPU).

    Weights are loaded in the checkpoint's own dtype so the scales are rounded
    to the dtype they are stored in; every non-weight file (config, tokenizer,
    generation config, chat template) is copied so `dst` serves on its own.
    `checkpoint_format` "hydrant" writes the engine's own layout (loads without
    re-quantizing); "compressed-tensors" writes the same codes as a Hugging Face
    `pack-quantized` checkpoint for vLLM and transformers
    (`hydrant.engine.compressed_tensors_export`). Both quantize `src` by
    round-to-nearest, whose int4 zero points are integers: the conversion is exact.
    """
    src, dst = Path(src), Path(dst)
    hub = read_hub_quantization(src)
    if read_quantization_manifest(src) is not None or hub is not None:
        already = f" ({hub.describe()})" if hub is not None else ""
        raise ModelLoadError(f"{src} is already a quantized checkpoint{already}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ModelLoadError(f"{dst} exists and is not an empty directory")
    model_config = read_model_config(src)
    dtype = model_config.checkpoint_dtype or torch.float32
    progress(f"loading {src} ({str(dtype).removeprefix('torch.')})")
    model = load_model(src, model_config, "cpu", dtype, 1, show_progress=False)
    progress(f"quantizing to {mode}")
    report = quantize_model(model, mode)
    if not report.quantized:
        raise ModelLoadError(f"no linear layer of {src} can be quantized to {mode}")
    if checkpoint_format == "compressed-tensors":
        progress(f"writing {dst} (compressed-tensors pack-quantized, Hugging Face names)")
        dst.mkdir(parents=True, exist_ok=True)
        _copy_side_files(src, dst)
        save_compressed_tensors(model, report, dst)
    else:
        progress(f"writing {dst}")
        save_quantized(model, dst)
        _copy_side_files(src, dst)
    return report


def _copy_side_files(src: Path, dst: Path) -> None:
    """Every non-weight file (config, tokenizer, chat template), so `dst` serves on its own."""
    for path in sorted(src.iterdir()):
        if path.is_file() and path.name != INDEX_FILE and path.suffix not in _WEIGHT_SUFFIXES:
            shutil.copy2(path, dst / path.name)
