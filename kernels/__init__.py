"""Triton kernels, each beside its launcher, with PyTorch references for CPU and tests."""
