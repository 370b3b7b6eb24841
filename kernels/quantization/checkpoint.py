"""Save and load already-quantized checkpoints, so a server never re-quantizes at start.

Directory layout written by `save_quantized(model, dir)`:

- `model.safetensors`: every tensor of the quantized model's state dict
  (tied tensors stored once). Its header metadata holds the manifest under
  `"hydrant.quantization"` too, so the file alone is self-describing.
- `hydrant_quantization.json`: the manifest, readable without opening tensors:
  `{"format_version": 1, "mode": "int8"|"int4", "group_size": G,
  "modules": {NAME: {"in_features", "out_features", "bias", "input_scale", "dtype"}}}`.
- `config.json` when the model carries a transformers-style `config`.

Tensor naming for each quantized linear `NAME` (e.g. `model.layers.0.mlp.up_proj`):

- `NAME.qweight`: int8 `[out, in]` (int8), or uint8 `[out, in // 2]` (int4;
  byte j holds column 2j in its low nibble and 2j+1 in its high nibble);
- `NAME.scales`: `[out]` (int8), or `[out, in // group_size]` (int4);
- `NAME.zeros`: int4 only, `[out, in // group_size]`, float, with
  `w = (q - zeros) * scales` per group;
- `NAME.bias`: `[out]`, when the layer has a bias;
- `NAME.input_scale`: `[in]`, when activation-aware calibration was used
  (the layer multiplies its input by it).

Every other tensor keeps its usual state-dict name (`model.embed_tokens.weight`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_model, save_model
from torch import nn

from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.quantization.linear import QuantizedLinear, QuantMode

FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "hydrant_quantization.json"
METADATA_KEY = "hydrant.quantization"


@dataclass(frozen=True)
class QuantizedModuleSpec:
    in_features: int
    out_features: int
    bias: bool
    input_scale: bool
    dtype: str


@dataclass(frozen=True)
class QuantizationManifest:
    """Which modules of a checkpoint are quantized, and how."""

    mode: QuantMode
    group_size: int
    modules: dict[str, QuantizedModuleSpec] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format_version": FORMAT_VERSION,
                "mode": self.mode,
                "group_size": self.group_size,
                "modules": {name: vars(spec) for name, spec in sorted(self.modules.items())},
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> QuantizationManifest:
        try:
            raw: dict[str, Any] = json.loads(text)
            if raw.get("format_version") != FORMAT_VERSION:
                raise KernelArgumentError(
                    f"unsupported quantized checkpoint format {raw.get('format_version')!r}"
                )
            modules = {name: QuantizedModuleSpec(**spec) for name, spec in raw["modules"].items()}
            mode: QuantMode
            if raw["mode"] == "int8":
                mode = "int8"
            elif raw["mode"] == "int4":
                mode = "int4"
            else:
                raise KernelArgumentError(f"unknown quantization mode {raw['mode']!r}")
            return cls(mode=mode, group_size=int(raw["group_size"]), modules=modules)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, KernelArgumentError):
                raise
            raise KernelArgumentError(f"malformed quantization manifest: {exc}") from exc

    @classmethod
    def of_model(cls, model: nn.Module) -> QuantizationManifest:
        found = {n: m for n, m in model.named_modules() if isinstance(m, QuantizedLinear)}
        if not found:
            raise KernelArgumentError("the model has no QuantizedLinear modules to save")
        modes = {m.mode for m in found.values()}
        groups = {m.group_size for m in found.values() if m.mode == "int4"}
        if len(modes) > 1 or len(groups) > 1:
            raise KernelArgumentError(
                f"mixed quantization ({modes}, groups {groups}) is unsupported"
            )
        modules = {
            name: QuantizedModuleSpec(
                in_features=m.in_features,
                out_features=m.out_features,
                bias=m.bias is not None,
                input_scale=m.input_scale is not None,
                dtype=str(m.scales.dtype).removeprefix("torch."),
            )
            for name, m in found.items()
        }
        return cls(mode=modes.pop(), group_size=groups.pop() if groups else 0, modules=modules)


def save_quantized(model: nn.Module, directory: str | Path) -> QuantizationManifest:
    """Write the quantized model's tensors, manifest and (if present) config to `directory`."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    manifest = QuantizationManifest.of_model(model)
    text = manifest.to_json()
    save_model(model, str(path / WEIGHTS_FILE), metadata={"format": "pt", METADATA_KEY: text})
    (path / MANIFEST_FILE).write_text(text + "\n", encoding="utf-8")
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_file"):
        config.to_json_file(str(path / "config.json"))
    return manifest


def read_quantization_manifest(directory: str | Path) -> QuantizationManifest | None:
    """The manifest of a quantized checkpoint directory, or None for a plain float checkpoint."""
    path = Path(directory)
    if (path / MANIFEST_FILE).is_file():
        return QuantizationManifest.from_json((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    weights = path / WEIGHTS_FILE
    if weights.is_file():
        with safe_open(str(weights), framework="pt") as handle:
            text = (handle.metadata() or {}).get(METADATA_KEY)
        if text:
            return QuantizationManifest.from_json(text)
    return None


def prepare_quantized_modules(
    model: nn.Module, manifest: QuantizationManifest, device: torch.device | str | None = None
) -> None:
    """Swap each listed `nn.Linear` for an empty `QuantizedLinear` of the same shape (no work).

    The engine's own loader can call this on a meta-device model and then
    assign the tensors named in this module's docstring.
    """
    for name, spec in manifest.modules.items():
        try:
            current = model.get_submodule(name)
        except AttributeError as exc:
            raise KernelArgumentError(f"checkpoint module {name!r} is not in the model") from exc
        if not isinstance(current, nn.Linear | QuantizedLinear):
            raise KernelArgumentError(f"{name!r} is a {type(current).__name__}, not a linear")
        if (current.in_features, current.out_features) != (spec.in_features, spec.out_features):
            raise KernelArgumentError(
                f"{name!r} is {current.in_features}->{current.out_features} in the model but "
                f"{spec.in_features}->{spec.out_features} in the checkpoint"
            )
        own = [*current.parameters(), *current.buffers()]
        target_device = device or (own[0].device if own else "cpu")
        replacement = QuantizedLinear(
            spec.in_features,
            spec.out_features,
            manifest.mode,
            group_size=manifest.group_size or 128,
            bias=spec.bias,
            input_scale=spec.input_scale,
            dtype=getattr(torch, spec.dtype),
            device=target_device,
        )
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)


def load_quantized(
    model: nn.Module, directory: str | Path, device: torch.device | str = "cpu"
) -> QuantizationManifest:
    """Turn a float model (materialised, e.g. built on CPU) into the saved quantized one."""
    manifest = read_quantization_manifest(directory)
    if manifest is None:
        raise KernelArgumentError(f"{directory} is not a quantized checkpoint (no manifest)")
    if any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()]):
        raise KernelArgumentError(
            "load_quantized needs a materialised model; call model.to_empty(device=...) first"
        )
    model.to(device)
    prepare_quantized_modules(model, manifest, device)
    missing, unexpected = load_model(
        model, str(Path(directory) / WEIGHTS_FILE), strict=False, device=str(device)
    )
    if missing or unexpected:
        raise KernelArgumentError(
            f"checkpoint does not match the model: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}"
        )
    return manifest
