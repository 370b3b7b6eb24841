"""Give a randomly initialised Llama realistic weight statistics before quantizing it.

A default random init (normal, std 0.02) yields near-uniform next-token
distributions and Gaussian weights, on which any quantizer looks perfect or
meaningless. Trained Llamas differ in three ways that matter to quantization,
and this transform reproduces them:

- heavy-tailed weights (Student-t, 5 degrees of freedom): the row / group
  maximum, which sets the quantization step, sits far above the typical value;
- outlier hidden channels: a few RMSNorm gains are ~8x the rest, so some input
  columns of every projection see much larger activations (what AWQ exploits);
- confident predictions: the output head is scaled so next-token entropy is a
  few nats, not log(vocab), and top-1 agreement means something.

The model must have the HF Llama structure (`model.embed_tokens`,
`model.layers[i].{self_attn,mlp,input_layernorm,post_attention_layernorm}`,
`model.norm`, `lm_head`); nothing here imports transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

OUTLIER_FRACTION = 0.02
OUTLIER_GAIN = 8.0
HEAD_GAIN = 5.0


def _student_t(shape: tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    """Student-t(5) samples rescaled to the given standard deviation (t(5) has variance 5/3)."""
    df = 5.0
    normal = torch.randn(shape, generator=generator)
    chi2 = torch.randn((*shape, int(df)), generator=generator).pow(2).sum(-1)
    return normal / torch.sqrt(chi2 / df) * std / (df / (df - 2)) ** 0.5


def apply_realistic_weights(model: Any, seed: int = 0) -> Any:
    """Overwrite every weight of an HF-structured Llama in place; returns the model.

    `model` is duck-typed (an `nn.Module` with the HF Llama attribute tree).
    """
    gen = torch.Generator().manual_seed(seed)
    core = model.model
    hidden = core.embed_tokens.weight.shape[1]
    outliers = torch.randperm(hidden, generator=gen)[: max(1, int(hidden * OUTLIER_FRACTION))]

    def gains() -> torch.Tensor:
        g = 1.0 + 0.1 * torch.randn(hidden, generator=gen)
        g[outliers] = OUTLIER_GAIN * (1.0 + 0.1 * torch.rand(len(outliers), generator=gen))
        return g

    with torch.no_grad():
        core.embed_tokens.weight.copy_(torch.randn(core.embed_tokens.weight.shape, generator=gen))
        for layer in core.layers:
            layer.input_layernorm.weight.copy_(gains())
            layer.post_attention_layernorm.weight.copy_(gains())
            for proj in (
                *_projections(layer.self_attn, ("q_proj", "k_proj", "v_proj")),
                *_projections(layer.mlp, ("gate_proj", "up_proj")),
            ):
                proj.weight.copy_(_student_t(tuple(proj.weight.shape), proj.in_features**-0.5, gen))
            for proj in (
                *_projections(layer.self_attn, ("o_proj",)),
                *_projections(layer.mlp, ("down_proj",)),
            ):
                proj.weight.copy_(
                    _student_t(tuple(proj.weight.shape), 0.5 * proj.in_features**-0.5, gen)
                )
        core.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden, generator=gen))
        head = model.lm_head
        head.weight.copy_(_student_t(tuple(head.weight.shape), HEAD_GAIN * hidden**-0.5, gen))
    return model


def _projections(parent: Any, names: tuple[str, ...]) -> list[nn.Linear]:
    return [getattr(parent, name) for name in names]
