"""The quantization accuracy gates, run on the engine's own model.

`scoring` drives a `ModelRunner` (the engine's loader, quantization, kernel
backend and paged KV cache) teacher-forced over fixed sequences; `evaluate`
defines the gates and runs them per kernel backend. Shared by
`tests/engine/test_quant_accuracy.py` (which asserts the gates) and
`bench/quant_accuracy.py` (which prints them), so the numbers a reviewer reads
are the ones CI checks. They live in the engine, not in `hydrant.kernels`,
because they run the engine (and kernels never import the engine).
"""
