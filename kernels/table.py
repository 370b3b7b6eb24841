"""The row type of the one kernel-backend table: which ops a backend runs, which features it has.

Every implementation of the model's kernels is a `KernelBackend`: the Triton
kernels (`triton_backend.py`), the PyTorch references (`reference_backend.py`)
and the CPU's tuned code (`cpu/backend.py`); `backends.py` is the table itself.
An engine picks one row when it is built and calls its ops; no op chooses an
implementation per call.

Every row implements every op in `OPS` with one signature (the protocols
below). What differs between rows is declared, never discovered by a failing
call, as features:

- `kv_int8`: the KV ops take int8 caches with per-token, per-head float32
  scales (`k_scale=`, `v_scale=`), quantizing on write and dequantizing inside
  attention;
- `planned_decode`: decode attention can run over a plan built once per step on
  the host (`decode_planner`, `planned_decode_attention`), shared by every layer;
- `graph_capture`: every op can be captured in a CUDA graph (no host sync, no
  allocation sized by a device value);
- `fast_linears`: the float linears of a model can be switched to a faster GEMM
  (`optimize_linears`, `linear_for`).

A feature's ops are set exactly when the feature is claimed (checked when a
row is made), and `require(feature)` refuses a missing one with a clear error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, get_args

import torch
from torch import nn

from hydrant.kernels.errors import KernelBackendError

Feature = Literal["kv_int8", "planned_decode", "graph_capture", "fast_linears"]
FEATURES: tuple[Feature, ...] = get_args(Feature)

OPS = (
    "write_kv",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "w8a16_matmul",
    "w4a16_matmul",
    "lora_bgmv",
    "lora_sgmv",
)
# the ops a feature brings: set on a row exactly when it claims the feature
FEATURE_OPS: dict[Feature, tuple[str, ...]] = {
    "kv_int8": (),
    "planned_decode": ("decode_planner", "planned_decode_attention"),
    "graph_capture": (),
    "fast_linears": ("optimize_linears", "linear_for"),
}

DecodePlan = Any  # what a backend's planner builds; only that backend's attention reads it
LinearFn = Callable[..., torch.Tensor]  # `F.linear`'s signature: (x, weight, bias=None)


class WriteKV(Protocol):
    def __call__(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None: ...


class DecodeAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class PrefillAttention(Protocol):
    def __call__(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        max_seqlen_q: int | None = None,
        *,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


class RmsNorm(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class W4A16(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        qweight: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor,
        group_size: int = 128,
    ) -> torch.Tensor: ...


class LoraBGMV(Protocol):
    """Adds each row's LoRA delta to `y` in place (rows of slot -1 untouched)."""

    def __call__(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scales: torch.Tensor,
        token_slots: torch.Tensor,
    ) -> None: ...


class LoraSGMV(Protocol):
    """Adds each segment's LoRA delta to its rows of `y` in place (slot -1 untouched)."""

    def __call__(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scales: torch.Tensor,
        seg_starts: torch.Tensor,
        seg_slots: torch.Tensor,
        max_seg_len: int | None = None,
    ) -> None: ...


Rotary = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]
# (block_size, num_kv_heads, head_dim, dtype, device) -> (block tables, context lens) -> plan
DecodePlanner = Callable[
    [int, int, int, torch.dtype, torch.device],
    Callable[[list[list[int]], list[int]], DecodePlan],
]
PlannedDecode = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, DecodePlan, float], torch.Tensor
]


@dataclass(frozen=True)
class KernelBackend:
    """One row of the table: a complete set of ops, and the features it declares.

    `name` is the table's key ("triton", "reference", "cpu"); `detail` says
    which variant of it this is, for the engine's log.
    """

    name: str
    detail: str
    features: frozenset[Feature]
    write_kv: WriteKV
    paged_decode_attention: DecodeAttention
    paged_prefill_attention: PrefillAttention
    rms_norm: RmsNorm
    rotary_embedding: Rotary
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    w8a16_matmul: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    w4a16_matmul: W4A16
    lora_bgmv: LoraBGMV
    lora_sgmv: LoraSGMV
    decode_planner: DecodePlanner | None = None
    planned_decode_attention: PlannedDecode | None = None
    optimize_linears: Callable[[nn.Module], int] | None = None
    linear_for: Callable[[torch.Tensor], LinearFn] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise KernelBackendError(f"backend {self.name!r} declares unknown features {unknown}")
        for feature, names in FEATURE_OPS.items():
            for op in names:
                claimed, present = feature in self.features, getattr(self, op) is not None
                if claimed != present:
                    state = "claims" if claimed else "does not claim"
                    raise KernelBackendError(
                        f"backend {self.name!r} {state} {feature!r} but "
                        f"{'lacks' if claimed else 'sets'} its op {op!r}"
                    )

    def has(self, feature: Feature) -> bool:
        return feature in self.features

    def require(self, feature: Feature) -> None:
        """Refuse a feature this row lacks, naming the row."""
        if feature not in self.features:
            raise self._missing(feature)

    def planner(self) -> DecodePlanner:
        """The `planned_decode` feature's planner factory (refused when the row lacks it)."""
        if self.decode_planner is None:
            raise self._missing("planned_decode")
        return self.decode_planner

    def planned(self) -> PlannedDecode:
        """The `planned_decode` feature's attention over a plan (refused when the row lacks it)."""
        if self.planned_decode_attention is None:
            raise self._missing("planned_decode")
        return self.planned_decode_attention

    def _missing(self, feature: Feature) -> KernelBackendError:
        return KernelBackendError(
            f"the {self.name} kernel backend has no {feature!r} ({self.detail})"
        )
