"""Triton kernels, each beside its launcher, with PyTorch references for CPU and tests.

Call ops through `hydrant.kernels.ops` (the one dispatch point); the rest is
implementation:

- `reference`: every op in plain PyTorch (CPU path, test oracle);
- `kv_write`, `decode_attention`, `prefill_attention`, `rms_norm`, `rotary`,
  `activation`, `quant_matmul` (+ `matmul_config`): a Triton kernel and its
  launcher each; imported lazily, so CPU processes never load Triton;
- `arguments`, `errors`, `backend`, `triton_support`: checks, errors, backend choice;
- `rope_cache`, `int4_layout`: the rope table and the packed INT4 layout;
- `quantization`: `quantize_model`, `QuantizedLinear`, quantized checkpoints;
- `accuracy`: the quantization accuracy gates (tests and `bench/quant_accuracy.py`).
"""
