"""Choosing the next token of every running sequence from one batch of logits.

The order of operations (each step batched on the logits' device, applied
only to the rows that ask for it):

0. `logit_bias` is added to the model's logits, as OpenAI defines it (and
   vLLM orders it: before the penalties, whose scaling then sees the biased
   logit).
1. `min_tokens`: EOS and `stop_token_ids` get -inf until the sequence has
   that many output tokens.
2. Repetition penalty over prompt + output (transformers' semantics), then
   presence / frequency penalties over the output (OpenAI's).
2b. Structured output: a row with a guide (a JSON schema's parser) gets -inf
   on every token its grammar does not allow next, before the warpers, so
   top-k / top-p choose among allowed tokens only.
3. Greedy rows (temperature 0) take the argmax.
4. Other rows: temperature, top-k, top-p, min-p (transformers' warper order),
   then one draw from the resulting distribution.

Logprobs are those of the processed distribution the token was drawn from:
after step 2 for greedy rows, after step 4's filters (temperature included)
for sampled rows. Alternatives masked to -inf are left out of `top`. Prompt
logprobs (`score_tokens`) are the model's raw distribution: nothing was drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hydrant.engine.logits_processing import (
    NEG_INF,
    apply_min_p,
    apply_presence_frequency_penalties,
    apply_repetition_penalty,
    apply_top_k_top_p,
    sample_from_probs,
    token_counts,
    token_id_matrix,
)
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.structured_output import Guide, apply_masks


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator | None:
    """The per-sequence generator for a seeded request (None when unseeded).

    Sequence `i` of an `n > 1` request should pass `seed + i`, so its samples
    differ from its siblings' yet stay reproducible.
    """
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed % 2**64)
    return generator


def score_tokens(logits: torch.Tensor, token_ids: torch.Tensor, k: int) -> list[TokenLogprob]:
    """Each row's logprob of its given token and its `k` most likely tokens (raw logits)."""
    logprobs = logits.float().log_softmax(dim=-1)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1)).squeeze(1).tolist()
    top_values, top_ids = logprobs.topk(min(k, logits.shape[1]), dim=-1)
    ids, values = top_ids.tolist(), top_values.tolist()
    return [
        TokenLogprob(token_id=t, logprob=lp, top=list(zip(ids[j], values[j], strict=True)))
        for j, (t, lp) in enumerate(zip(token_ids.tolist(), chosen, strict=True))
    ]


@dataclass
class SamplingRow:
    """One sequence to sample for: its settings, its tokens so far and its generator."""

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    guide: Guide | None = None


@dataclass
class TokenLogprob:
    """The chosen token's logprob and the `k` most likely tokens (id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class SampleResult:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]


def _rows(rows: Sequence[SamplingRow], wanted: Sequence[bool]) -> list[int]:
    return [i for i, w in enumerate(wanted) if w]


class Sampler:
    """Stateless apart from the EOS ids; one instance serves every step of an engine."""

    def __init__(self, eos_token_ids: frozenset[int] | set[int] = frozenset()) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)

    def __call__(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleResult:
        if logits.dim() != 2 or logits.shape[0] != len(rows):
            raise ValueError(
                f"logits must be [num_rows, vocab] with one row per SamplingRow; "
                f"got {tuple(logits.shape)} for {len(rows)} rows"
            )
        if not rows:
            return SampleResult(token_ids=[], logprobs=[])
        if logits.dtype == torch.float32 and all(self._as_is(row) for row in rows):
            plain = self._sample_as_is(logits, rows)
            if plain is not None:
                return plain
        processed = self.process(logits, rows)
        greedy_idx = _rows(rows, [r.params.is_greedy for r in rows])
        sampled_idx = _rows(rows, [not r.params.is_greedy for r in rows])
        token_ids = torch.empty(len(rows), dtype=torch.int64, device=processed.device)
        if greedy_idx:
            index = torch.tensor(greedy_idx, device=processed.device)
            token_ids[index] = processed[index].argmax(dim=-1)
        if sampled_idx:
            index = torch.tensor(sampled_idx, device=processed.device)
            generators = [rows[i].generator for i in sampled_idx]
            token_ids[index] = sample_from_probs(processed[index].softmax(dim=-1), generators)
        return SampleResult(
            token_ids=token_ids.tolist(), logprobs=self._logprobs(processed, token_ids, rows)
        )

    def _as_is(self, row: SamplingRow) -> bool:
        """Whether the row draws from the model's logits as they are, temperature aside.

        Most requests ask for nothing else (no bias, penalty, grammar, logprobs,
        top-k/p or min-p, no pending `min_tokens` mask); for a batch of only such
        rows the general path's float copy, index gathers and scatters are passes
        over `[rows, vocab]` that change nothing, and on a GPU a dozen launches a
        step between graph replays.
        """
        params = row.params
        if (
            params.logprobs is not None
            or params.logit_bias
            or row.guide is not None
            or params.repetition_penalty != 1.0
            or params.presence_penalty != 0
            or params.frequency_penalty != 0
        ):
            return False
        if len(row.output_token_ids) < params.min_tokens and (
            params.stop_token_ids or (not params.ignore_eos and self.eos_token_ids)
        ):
            return False
        return params.is_greedy or (params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0)

    @staticmethod
    def _sample_as_is(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> SampleResult | None:
        """All-greedy or all-sampled batches of `_as_is` rows, with the same arithmetic as
        the general path (so the same tokens, seeded draws included); None for a mix."""
        greedy = [row.params.is_greedy for row in rows]
        none: list[TokenLogprob | None] = [None] * len(rows)
        if all(greedy):
            return SampleResult(token_ids=logits.argmax(dim=-1).tolist(), logprobs=none)
        if any(greedy):
            return None
        temperatures = [row.params.temperature for row in rows]
        if any(t != 1.0 for t in temperatures):
            scale = torch.tensor(temperatures, device=logits.device)
            logits = logits / scale.unsqueeze(1)
        token_ids = sample_from_probs(logits.softmax(dim=-1), [row.generator for row in rows])
        return SampleResult(token_ids=token_ids.tolist(), logprobs=none)

    def process(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> torch.Tensor:
        """The distribution each row's token is drawn from, as logits (a float32 copy).

        Greedy rows stop after the penalties; their argmax is the token.
        """
        logits = logits.to(torch.float32, copy=True)
        self._add_logit_bias(logits, rows)
        self._mask_until_min_tokens(logits, rows)
        self._apply_penalties(logits, rows)
        apply_masks(logits, [r.guide for r in rows])
        sampled_idx = _rows(rows, [not r.params.is_greedy for r in rows])
        if sampled_idx:
            index = torch.tensor(sampled_idx, device=logits.device)
            logits[index] = self._warp([rows[i] for i in sampled_idx], logits[index])
        return logits

    @staticmethod
    def _add_logit_bias(logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        """One indexed add for every biased (row, token) of the step."""
        row_index: list[int] = []
        col_index: list[int] = []
        values: list[float] = []
        for i, row in enumerate(rows):
            for token, bias in row.params.logit_bias:
                row_index.append(i)
                col_index.append(token)
                values.append(bias)
        if row_index:
            device = logits.device
            logits.index_put_(
                (torch.tensor(row_index, device=device), torch.tensor(col_index, device=device)),
                torch.tensor(values, dtype=logits.dtype, device=device),
                accumulate=True,
            )

    def _mask_until_min_tokens(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        vocab = logits.shape[1]
        row_index: list[int] = []
        col_index: list[int] = []
        for i, row in enumerate(rows):
            params = row.params
            if len(row.output_token_ids) >= params.min_tokens:
                continue
            banned = set(params.stop_token_ids)
            if not params.ignore_eos:
                banned |= self.eos_token_ids
            for token in sorted(t for t in banned if 0 <= t < vocab):
                row_index.append(i)
                col_index.append(token)
        if row_index:
            rows_t = torch.tensor(row_index, device=logits.device)
            cols_t = torch.tensor(col_index, device=logits.device)
            logits[rows_t, cols_t] = NEG_INF

    def _apply_penalties(self, logits: torch.Tensor, rows: Sequence[SamplingRow]) -> None:
        vocab, device = logits.shape[1], logits.device
        rep_idx = _rows(rows, [r.params.repetition_penalty != 1.0 for r in rows])
        if rep_idx:
            context = [[*rows[i].prompt_token_ids, *rows[i].output_token_ids] for i in rep_idx]
            seen = token_counts(token_id_matrix(context, vocab, device), vocab) > 0
            penalty = torch.tensor(
                [rows[i].params.repetition_penalty for i in rep_idx], device=device
            )
            index = torch.tensor(rep_idx, device=device)
            sub = logits[index]
            apply_repetition_penalty(sub, seen, penalty)
            logits[index] = sub
        pf_idx = _rows(
            rows,
            [r.params.presence_penalty != 0 or r.params.frequency_penalty != 0 for r in rows],
        )
        if pf_idx:
            outputs = [rows[i].output_token_ids for i in pf_idx]
            counts = token_counts(token_id_matrix(outputs, vocab, device), vocab)
            presence = torch.tensor(
                [rows[i].params.presence_penalty for i in pf_idx], device=device
            )
            frequency = torch.tensor(
                [rows[i].params.frequency_penalty for i in pf_idx], device=device
            )
            index = torch.tensor(pf_idx, device=device)
            sub = logits[index]
            apply_presence_frequency_penalties(sub, counts, presence, frequency)
            logits[index] = sub

    @staticmethod
    def _warp(rows: Sequence[SamplingRow], logits: torch.Tensor) -> torch.Tensor:
        """Temperature, top-k, top-p, min-p for the sampled rows (a [len(rows), V] copy)."""
        vocab, device = logits.shape[1], logits.device
        params = [r.params for r in rows]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temperature.unsqueeze(1)
        use_k = any(0 < p.top_k < vocab for p in params)
        use_p = any(p.top_p < 1.0 for p in params)
        if use_k or use_p:
            top_k = (
                torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
                if use_k
                else None
            )
            top_p = torch.tensor([p.top_p for p in params], device=device) if use_p else None
            logits = apply_top_k_top_p(logits, top_k, top_p)
        if any(p.min_p > 0 for p in params):
            apply_min_p(logits, torch.tensor([p.min_p for p in params], device=device))
        return logits

    @staticmethod
    def _logprobs(
        logits: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[SamplingRow]
    ) -> list[TokenLogprob | None]:
        result: list[TokenLogprob | None] = [None] * len(rows)
        wanted = _rows(rows, [r.params.logprobs is not None for r in rows])
        if not wanted:
            return result
        index = torch.tensor(wanted, device=logits.device)
        k_max = max(rows[i].params.logprobs or 0 for i in wanted)
        scored = score_tokens(logits[index], token_ids[index], k_max)
        for entry, i in zip(scored, wanted, strict=True):
            k = rows[i].params.logprobs or 0
            top = [(t, v) for t, v in entry.top[:k] if v > NEG_INF]
            result[i] = TokenLogprob(token_id=entry.token_id, logprob=entry.logprob, top=top)
        return result
