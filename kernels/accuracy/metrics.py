"""Next-token agreement between a float32 reference and a quantized candidate.

Mean KL divergence `KL(P_ref || P_cand)` over positions measures how much
probability mass moved; top-1 agreement measures whether greedy decoding
would pick the same token. Both are computed in float64 from log-softmax so
tiny divergences are not lost to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hydrant.kernels.errors import KernelArgumentError


@dataclass(frozen=True)
class NextTokenMetrics:
    mean_kl: float
    top1_agreement: float
    positions: int


def next_token_metrics(reference: torch.Tensor, candidate: torch.Tensor) -> NextTokenMetrics:
    """Compare logits `[positions, vocab]` of the reference and the candidate."""
    if reference.shape != candidate.shape or reference.dim() != 2:
        raise KernelArgumentError(
            f"logits must both be [positions, vocab]; got {tuple(reference.shape)} and "
            f"{tuple(candidate.shape)}"
        )
    ref_log = torch.log_softmax(reference.to(torch.float64), dim=-1)
    cand_log = torch.log_softmax(candidate.to(torch.float64), dim=-1)
    kl = (ref_log.exp() * (ref_log - cand_log)).sum(dim=-1)
    top1 = (reference.argmax(dim=-1) == candidate.argmax(dim=-1)).to(torch.float64)
    return NextTokenMetrics(
        mean_kl=float(kl.mean()), top1_agreement=float(top1.mean()), positions=reference.shape[0]
    )


def mean_entropy(logits: torch.Tensor) -> float:
    """Mean next-token entropy in nats: how peaked the reference distributions are."""
    log_p = torch.log_softmax(logits.to(torch.float64), dim=-1)
    return float(-(log_p.exp() * log_p).sum(dim=-1).mean())
