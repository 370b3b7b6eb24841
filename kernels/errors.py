"""Errors raised by kernel launchers and the dispatch point.

A launcher that is handed a tensor of the wrong shape, dtype, device or stride
must fail before the kernel runs: a Triton kernel reading past a buffer gives
garbage or a device fault far from the cause. `KernelArgumentError` subclasses
`ValueError` so callers that already catch bad input keep working.
"""

from __future__ import annotations


class KernelArgumentError(ValueError):
    """A kernel op was called with arguments it cannot accept (shape, dtype, stride, device)."""


class KernelBackendError(RuntimeError):
    """The requested kernel backend cannot run here (e.g. Triton without CUDA or interpreter)."""
