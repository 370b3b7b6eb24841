"""Sleep mode: give the device back without forgetting the weights.

vLLM's "sleep level 1": a sleeping engine frees its KV cache and moves its
weights to a host copy (pinned, so the copy back runs at full PCIe speed and
can overlap); waking copies them back and re-allocates the cache. No file is
opened on wake, so a wake costs a host-to-device copy instead of a disk read
plus a model build. On CPU the weights already live in process memory (the
loader materializes them, see loader.py), so sleeping frees the KV cache only.
"""

from __future__ import annotations

import torch
from torch import nn

from hydrant.engine.errors import EngineError


class EngineSleepingError(EngineError):
    """The engine is asleep (or going to sleep, or waking): it takes no new request.

    The worker maps it to "not ready", and the dispatcher routes elsewhere or wakes it.
    """


class EngineBusyError(EngineError):
    """Sleep was asked of an engine that still holds requests (the async front drains first)."""


def _pinned_copy(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def offload_weights(model: nn.Module) -> int:
    """Move every parameter, buffer and the RoPE table to pinned host memory; returns bytes.

    Parameters keep their identity (`param.data` is swapped), so nothing that
    holds a reference to a parameter (an optimizer, a compiled graph) dangles.
    """
    moved = 0
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and param.device.type != "cpu":
                param.data = _pinned_copy(param.data)
                moved += param.numel() * param.element_size()
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device.type != "cpu":
                module._buffers[name] = _pinned_copy(buffer)
                moved += buffer.numel() * buffer.element_size()
    rope = getattr(model, "cos_sin_cache", None)
    if isinstance(rope, torch.Tensor) and rope.device.type != "cpu":
        model.cos_sin_cache = _pinned_copy(rope)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return moved


def restore_weights(model: nn.Module, device: torch.device) -> int:
    """Copy the host copy back onto `device` (no file is read); returns bytes moved."""
    if device.type == "cpu":
        return 0
    moved = 0
    for module in model.modules():
        for param in module._parameters.values():
            if param is not None and param.device.type == "cpu":
                param.data = param.data.to(device, non_blocking=True)
                moved += param.numel() * param.element_size()
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device.type == "cpu":
                module._buffers[name] = buffer.to(device, non_blocking=True)
                moved += buffer.numel() * buffer.element_size()
    rope = getattr(model, "cos_sin_cache", None)
    if isinstance(rope, torch.Tensor) and rope.device.type == "cpu":
        model.cos_sin_cache = rope.to(device, non_blocking=True)
    torch.cuda.synchronize(device)
    return moved
