"""Accuracy harness for quantization: metrics, a realistic synthetic Llama, a paged forward.

Shared by `tests/kernels` (which assert the gates) and `bench/quant_accuracy.py`
(which prints them), so the numbers a reviewer reads are the ones CI checks.
"""
