"""Batched logits transforms with per-row parameters, run on the logits' device.

Each function takes a [N, V] float32 tensor and per-row parameter tensors of
length N, and works in place where it can, so that one decode step of a large
batch costs a handful of kernel launches rather than a Python loop per row.
Their semantics are those of transformers' logits processors (which the tests
compare against) and, for presence/frequency penalties, OpenAI's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NEG_INF = float("-inf")


def token_id_matrix(
    lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device
) -> torch.Tensor:
    """Pad token id lists to one [N, L] int64 tensor; padding is `vocab_size` (a spare column)."""
    width = max((len(ids) for ids in lists), default=0)
    matrix = torch.full((len(lists), max(width, 1)), vocab_size, dtype=torch.int64)
    for row, ids in enumerate(lists):
        if ids:
            matrix[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.int64)
    return matrix.to(device, non_blocking=True)


def token_counts(ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """How often each vocabulary id occurs in each row of `ids` ([N, L] from token_id_matrix)."""
    counts = torch.zeros((ids.shape[0], vocab_size + 1), dtype=torch.float32, device=ids.device)
    counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_repetition_penalty(
    logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor
) -> None:
    """CTRL / transformers semantics: for every token already in the context
    (prompt and output), divide a positive logit by `penalty` and multiply a
    negative one by it, so a penalty > 1 always makes the token less likely.

    `seen` is a [N, V] bool mask, `penalty` a [N] tensor.
    """
    p = penalty.unsqueeze(1)
    penalized = torch.where(logits < 0, logits * p, logits / p)
    logits.copy_(torch.where(seen, penalized, logits))


def apply_presence_frequency_penalties(
    logits: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> None:
    """OpenAI semantics over the output tokens:
    logit -= frequency * count + presence * (count > 0)."""
    logits.sub_(counts * frequency.unsqueeze(1) + (counts > 0).float() * presence.unsqueeze(1))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask tokens outside each row's top-k, then outside its top-p nucleus.

    One ascending sort serves both. Top-k keeps ties with the k-th value and
    top-p keeps the smallest set whose probability reaches p (at least one
    token), both exactly as transformers' TopK/TopP warpers. `top_k` holds
    values in 1..V (V = off), `top_p` values in (0, 1] (1 = off).
    """
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=False)
    if top_k is not None:
        kth_index = (vocab - top_k.clamp(1, vocab)).unsqueeze(1)
        kth_value = sorted_logits.gather(1, kth_index)
        sorted_logits.masked_fill_(sorted_logits < kth_value, NEG_INF)
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p).unsqueeze(1)
        remove[:, -1] = False
        sorted_logits.masked_fill_(remove, NEG_INF)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Mask tokens whose probability is below min_p times the top token's (never the top one)."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    logits.masked_fill_(probs < threshold, NEG_INF)


def sample_from_probs(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """Draw one token per row, each seeded row from its own generator.

    Inverse CDF: one uniform `u` per row, scaled by the row's total, and the
    first token whose running sum exceeds it (`searchsorted(right=True)`). That
    costs one random number per row instead of one per vocabulary entry (the
    exponential race drew V of them), with no CPU sync, and a row's draw still
    depends only on its own probabilities and generator, so a seeded request
    samples the same tokens alone or in any batch. A token of probability 0
    adds nothing to the running sum, so the first sum above `u` is never its
    own; `u` is clamped strictly below the total so rounding cannot step past
    the last token with mass.
    """
    rows, device = probs.shape[0], probs.device
    uniform = torch.empty(rows, dtype=torch.float32, device=device)
    if any(g is None for g in generators):
        uniform.uniform_()
    for row, generator in enumerate(generators):
        if generator is not None:
            uniform[row : row + 1].uniform_(generator=generator)
    cdf = probs.float().cumsum(dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniform.unsqueeze(1) * total, total.nextafter(torch.zeros_like(total)))
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=probs.shape[1] - 1)
