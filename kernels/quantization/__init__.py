"""Weight-only INT8 / INT4 quantization of built models, and its checkpoint format.

`quantize_model` is a transform on an already built float model (gpt-fast's
rule: quantization is chosen by an explicit option, never inferred from a file
name); `save_quantized` / `load_quantized` persist the result so a server can
start from a quantized checkpoint without redoing the work.
"""

from hydrant.kernels.quantization.checkpoint import (
    QuantizationManifest,
    load_quantized,
    prepare_quantized_modules,
    read_quantization_manifest,
    save_quantized,
)
from hydrant.kernels.quantization.footprint import KVCacheReport, kv_cache_bytes, kv_cache_report
from hydrant.kernels.quantization.linear import QuantizedLinear
from hydrant.kernels.quantization.transform import (
    QuantizationMode,
    QuantizationReport,
    default_skip,
    quantize_model,
)

__all__ = [
    "KVCacheReport",
    "QuantizationManifest",
    "QuantizationMode",
    "QuantizationReport",
    "QuantizedLinear",
    "default_skip",
    "kv_cache_bytes",
    "kv_cache_report",
    "load_quantized",
    "prepare_quantized_modules",
    "quantize_model",
    "read_quantization_manifest",
    "save_quantized",
]
