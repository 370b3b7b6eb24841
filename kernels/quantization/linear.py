"""`QuantizedLinear`: a drop-in for `nn.Linear` whose weight lives as int8 or packed int4.

The quantized tensors are buffers, not parameters: nothing trains them, and
`module.to(dtype)` then converts only the float scales. The forward flattens
leading dimensions and calls the W8A16 / W4A16 op of `backend`, the row of the
kernel table an engine binds when it builds (`hydrant.engine.ops`); a module
used outside an engine runs the row for its device (Triton on CUDA, the
reference elsewhere).

An optional `input_scale` (per input channel) comes from activation-aware
calibration: the weight was quantized as `W * s` and the input is multiplied
by `1 / s` (stored here) at run time, which is exact in real arithmetic and
moves quantization error away from the channels with large activations.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from hydrant.kernels.backends import for_device
from hydrant.kernels.errors import KernelArgumentError
from hydrant.kernels.int4_layout import dequantize_int4
from hydrant.kernels.quantization.rtn import quantize_int4_groupwise, quantize_int8_per_channel
from hydrant.kernels.table import KernelBackend

QuantMode = Literal["int8", "int4"]


class QuantizedLinear(nn.Module):
    """`y = x @ dequant(W).T + b` with W held as int8 per-channel or int4 group-wise codes."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bias: torch.Tensor | None
    input_scale: torch.Tensor | None

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mode: QuantMode,
        *,
        group_size: int = 128,
        bias: bool = False,
        input_scale: bool = False,
        dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
    ) -> None:
        """Allocate empty (uninitialised) buffers of the right shapes, e.g. for loading."""
        super().__init__()
        if mode not in ("int8", "int4"):
            raise KernelArgumentError(f"mode must be 'int8' or 'int4', got {mode!r}")
        if mode == "int4" and (group_size <= 0 or in_features % group_size or group_size % 2):
            raise KernelArgumentError(
                f"int4 needs an even group_size dividing in_features={in_features}, "
                f"got {group_size}"
            )
        self.in_features, self.out_features = in_features, out_features
        self.mode: QuantMode = mode
        # the kernel-table row to run; None: the row for the input's device
        self.backend: KernelBackend | None = None
        self.group_size = group_size if mode == "int4" else in_features
        if mode == "int8":
            self.register_buffer(
                "qweight", torch.empty(out_features, in_features, dtype=torch.int8, device=device)
            )
            self.register_buffer("scales", torch.empty(out_features, dtype=dtype, device=device))
            self.register_buffer("zeros", None)
        else:
            groups = in_features // group_size
            self.register_buffer(
                "qweight",
                torch.empty(out_features, in_features // 2, dtype=torch.uint8, device=device),
            )
            self.register_buffer(
                "scales", torch.empty(out_features, groups, dtype=dtype, device=device)
            )
            self.register_buffer(
                "zeros", torch.empty(out_features, groups, dtype=dtype, device=device)
            )
        self.register_buffer(
            "bias", torch.empty(out_features, dtype=dtype, device=device) if bias else None
        )
        self.register_buffer(
            "input_scale",
            torch.empty(in_features, dtype=dtype, device=device) if input_scale else None,
        )

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        mode: QuantMode,
        *,
        group_size: int = 128,
        channel_scale: torch.Tensor | None = None,
    ) -> QuantizedLinear:
        """Quantize `linear` by round-to-nearest; `channel_scale` is the activation-aware `s`."""
        weight = linear.weight.detach()
        dtype, device = weight.dtype, weight.device
        module = cls(
            linear.in_features,
            linear.out_features,
            mode,
            group_size=group_size,
            bias=linear.bias is not None,
            input_scale=channel_scale is not None,
            dtype=dtype,
            device="meta",
        )
        # Every meta placeholder is replaced below: assigning to a registered buffer
        # name swaps the buffer (nn.Module.__setattr__), so nothing is allocated twice.
        if channel_scale is not None:
            s = channel_scale.to(device=device, dtype=torch.float32)
            weight = weight.to(torch.float32) * s[None, :]
            module.input_scale = (1.0 / s).to(dtype)
        if mode == "int8":
            module.qweight, module.scales = quantize_int8_per_channel(weight, dtype)
        else:
            module.qweight, module.scales, module.zeros = quantize_int4_groupwise(
                weight, group_size, dtype
            )
        if linear.bias is not None:
            module.bias = linear.bias.detach().clone()
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if self.input_scale is not None:
            flat = flat * self.input_scale.to(flat.dtype)
        kernels = self.backend or for_device(flat.device)
        if self.zeros is None:
            out = kernels.w8a16_matmul(flat, self.qweight, self.scales)
        else:
            out = kernels.w4a16_matmul(flat, self.qweight, self.scales, self.zeros, self.group_size)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 `[out, in]` weight this module multiplies by (input scale folded back)."""
        if self.zeros is None:
            weight = self.qweight.to(torch.float32) * self.scales.to(torch.float32)[:, None]
        else:
            weight = dequantize_int4(self.qweight, self.scales, self.zeros, self.group_size)
        if self.input_scale is not None:
            weight = weight * self.input_scale.to(torch.float32)[None, :]
        return weight

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.mode == "int4" else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"mode={self.mode}{group}, bias={self.bias is not None}"
        )
