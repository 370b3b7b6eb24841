"""Which hub quantization a checkpoint uses, read from `config.json`'s `quantization_config`.

AWQ, GPTQ and compressed-tensors checkpoints say how they are quantized in
`quantization_config` (`quant_method` awq | gptq | compressed-tensors). This
module turns that into one typed `HubQuantization`, or refuses it with a
`ModelLoadError` naming the field and value Hydrant cannot serve, before any
tensor is read: a variant the repacking does not understand (act-order rows,
Marlin or exllama packing, activation quantization) would otherwise load as
plausible-looking but wrong weights.

No torch here: the control plane reads it too, to say in `hydrant models
list` and readiness what a checkpoint is, or why it cannot be served.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hydrant.engine.errors import ModelLoadError

HubMethod = Literal["awq", "gptq", "compressed-tensors"]
HUB_METHODS: tuple[HubMethod, ...] = ("awq", "gptq", "compressed-tensors")
GPTQ_FORMATS = ("gptq", "gptq_v2")  # v1 stores zero points minus one, v2 as they are


@dataclass(frozen=True)
class HubQuantization:
    """A hub checkpoint's weight quantization, as far as loading it needs to know.

    `group_size` -1 is per output channel (one group of K); `not_converted`
    lists the modules the checkpoint keeps in float (names, or `re:` patterns
    for compressed-tensors' `ignore`); `checkpoint_format` is GPTQ's packing
    (`gptq` or `gptq_v2`), empty for the other methods.
    """

    method: HubMethod
    bits: int
    group_size: int
    symmetric: bool
    not_converted: tuple[str, ...] = ()
    checkpoint_format: str = ""

    @property
    def mode(self) -> Literal["int8", "int4"]:
        return "int8" if self.bits == 8 else "int4"

    def describe(self) -> str:
        """E.g. `awq int4 g128`: what the load log and `hydrant models list` show."""
        group = "channel" if self.group_size == -1 else f"g{self.group_size}"
        return f"{self.method} {self.mode} {group}{'' if self.symmetric else ' asym'}"

    def keeps_float(self, module: str) -> bool:
        """Whether the checkpoint lists `module` as not quantized."""
        for entry in self.not_converted:
            if entry.startswith("re:"):
                if re.match(entry[3:], module):
                    return True
            elif module == entry or module.endswith("." + entry):
                return True
        return False


def read_hub_quantization(model_dir: Path) -> HubQuantization | None:
    """The checkpoint's hub quantization, or None when `config.json` declares none."""
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None  # ModelConfig reports a missing or broken config.json
    section = raw.get("quantization_config") if isinstance(raw, dict) else None
    if section is None:
        return None
    return parse_hub_quantization(section)


def parse_hub_quantization(section: Mapping[str, Any]) -> HubQuantization:
    """Validate a `quantization_config` section; refuse what Hydrant cannot serve exactly."""
    if not isinstance(section, Mapping):
        raise ModelLoadError(f"quantization_config must be an object, got {section!r}")
    method = section.get("quant_method")
    if method == "awq":
        return _awq(section)
    if method == "gptq":
        return _gptq(section)
    if method == "compressed-tensors":
        return _compressed_tensors(section)
    raise ModelLoadError(
        f"quantization_config.quant_method = {method!r} is not supported "
        f"(Hydrant loads {', '.join(HUB_METHODS)})"
    )


def _refuse(method: str, field: str, value: object, supported: str) -> ModelLoadError:
    return ModelLoadError(
        f"{method} checkpoint: quantization_config.{field} = {value!r} is not supported "
        f"({supported})"
    )


def _group_size(method: str, section: Mapping[str, Any]) -> int:
    value = section.get("group_size", 128)
    if not isinstance(value, int) or isinstance(value, bool) or (value <= 0 and value != -1):
        raise _refuse(method, "group_size", value, "a positive group size, or -1 per channel")
    return value


def _not_converted(value: object) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _awq(section: Mapping[str, Any]) -> HubQuantization:
    bits = section.get("bits", section.get("w_bit"))
    if bits != 4:
        raise _refuse("awq", "bits", bits, "4 bits only")
    version = str(section.get("version", "gemm")).lower()
    if version != "gemm":
        raise _refuse("awq", "version", section.get("version"), "the GEMM packing only")
    if section.get("zero_point", True) is not True:
        raise _refuse("awq", "zero_point", section.get("zero_point"), "zero points required")
    # AutoAWQ writes `group_size`; its older configs `q_group_size`
    group = section.get("group_size", section.get("q_group_size", 128))
    return HubQuantization(
        method="awq",
        bits=4,
        group_size=_group_size("awq", {"group_size": group}),
        symmetric=False,
        not_converted=_not_converted(section.get("modules_to_not_convert")),
    )


def _gptq(section: Mapping[str, Any]) -> HubQuantization:
    bits = section.get("bits")
    if bits != 4:
        raise _refuse("gptq", "bits", bits, "4 bits only")
    if section.get("desc_act", False):
        raise _refuse(
            "gptq",
            "desc_act",
            section.get("desc_act"),
            "act-order reorders the input rows; re-export with desc_act false",
        )
    # GPTQModel writes `checkpoint_format`; older exporters `format` or `is_marlin_format`.
    packing = section.get("checkpoint_format", section.get("format", "gptq"))
    if section.get("is_marlin_format"):
        packing = "marlin"
    if packing not in GPTQ_FORMATS:
        raise _refuse("gptq", "checkpoint_format", packing, "gptq or gptq_v2 packing")
    if section.get("dynamic"):
        raise _refuse("gptq", "dynamic", section.get("dynamic"), "one setting for every module")
    return HubQuantization(
        method="gptq",
        bits=4,
        group_size=_group_size("gptq", section),
        symmetric=bool(section.get("sym", True)),
        not_converted=_not_converted(section.get("modules_to_not_convert")),
        checkpoint_format=str(packing),
    )


def _compressed_tensors(section: Mapping[str, Any]) -> HubQuantization:
    method = "compressed-tensors"
    top_format = section.get("format", "pack-quantized")
    for field in ("sparsity_config", "transform_config", "kv_cache_scheme"):
        if section.get(field):
            raise _refuse(method, field, section.get(field), "weight-only quantization")
    groups = section.get("config_groups") or {}
    if not isinstance(groups, Mapping) or not groups:
        raise _refuse(method, "config_groups", groups, "at least one weight scheme")
    schemes: set[tuple[int, int, bool]] = set()
    for name, scheme in groups.items():
        where = f"config_groups.{name}"
        if not isinstance(scheme, Mapping):
            raise _refuse(method, where, scheme, "a quantization scheme")
        scheme_format = scheme.get("format") or top_format
        if scheme_format != "pack-quantized":
            raise _refuse(method, f"{where}.format", scheme_format, "pack-quantized only")
        for field in ("input_activations", "output_activations"):
            if scheme.get(field) is not None:
                raise _refuse(
                    method,
                    f"{where}.{field}",
                    scheme.get(field),
                    "weight-only: activations must not be quantized",
                )
        schemes.add(_ct_weights(f"{where}.weights", scheme.get("weights")))
    if len(schemes) > 1:
        raise _refuse(method, "config_groups", sorted(schemes), "one weight scheme for all")
    bits, group_size, symmetric = schemes.pop()
    return HubQuantization(
        method="compressed-tensors",
        bits=bits,
        group_size=group_size,
        symmetric=symmetric,
        not_converted=_not_converted(section.get("ignore")),
    )


def _ct_weights(where: str, weights: object) -> tuple[int, int, bool]:
    """`(bits, group_size or -1, symmetric)` of one scheme's weight arguments."""
    method = "compressed-tensors"
    if not isinstance(weights, Mapping):
        raise _refuse(method, where, weights, "weight quantization arguments")
    if weights.get("type", "int") != "int":
        raise _refuse(method, f"{where}.type", weights.get("type"), "int only")
    if weights.get("dynamic", False):
        raise _refuse(method, f"{where}.dynamic", weights.get("dynamic"), "static weights")
    actorder = weights.get("actorder")
    if actorder not in (None, False, "weight", "static"):
        raise _refuse(method, f"{where}.actorder", actorder, "no reordering of input rows")
    bits = weights.get("num_bits")
    strategy = weights.get("strategy")
    symmetric = bool(weights.get("symmetric", True))
    if bits not in (4, 8):
        raise _refuse(method, f"{where}.num_bits", bits, "4 or 8")
    if strategy not in ("group", "channel"):
        raise _refuse(method, f"{where}.strategy", strategy, "group or channel")
    if bits == 8 and (strategy != "channel" or not symmetric):
        raise _refuse(
            method,
            f"{where}.strategy" if strategy != "channel" else f"{where}.symmetric",
            strategy if strategy != "channel" else symmetric,
            "8-bit weights load as W8A16: symmetric per channel",
        )
    group_size = -1
    if strategy == "group":
        group_size = _group_size(method, {"group_size": weights.get("group_size")})
    return bits, group_size, symmetric
