"""The sampler against transformers' logits processors, plus its own guarantees.

transformers' processors are the reference semantics (the ones users know
from `generate`); each comparison runs on random logits with different
parameters per row, so the batched per-row code paths are what is checked.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import cast

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hydrant.engine.logits_processing import sample_from_probs
from hydrant.engine.sampler import Sampler, SamplingRow, make_generator
from hydrant.engine.sampling_params import SamplingParams

VOCAB = 300
EOS = 7


def _logits(rows: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, VOCAB, generator=generator) * scale


def _row(
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    seed: int | None = None,
) -> SamplingRow:
    return SamplingRow(
        params=params,
        prompt_token_ids=prompt or [],
        output_token_ids=output or [],
        generator=make_generator(seed if seed is not None else params.seed, "cpu"),
    )


def _hf_warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    scores = logits.unsqueeze(0).clone()
    ids = cast(torch.LongTensor, torch.zeros((1, 1), dtype=torch.long))
    scores = TemperatureLogitsWarper(float(params.temperature))(ids, scores)
    if params.top_k > 0:
        scores = TopKLogitsWarper(params.top_k)(ids, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(float(params.top_p))(ids, scores)
    if params.min_p > 0.0:
        scores = MinPLogitsWarper(float(params.min_p))(ids, scores)
    return scores[0]


def _assert_same_distribution(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    finite = ~torch.isinf(theirs)
    torch.testing.assert_close(ours[finite], theirs[finite])


def test_greedy_is_argmax_of_the_logits() -> None:
    logits = _logits(6)
    rows = [_row(SamplingParams(temperature=0.0, logprobs=3)) for _ in range(6)]
    result = Sampler(frozenset({EOS}))(logits, rows)
    assert result.token_ids == logits.argmax(dim=-1).tolist()
    expected = logits.log_softmax(dim=-1)
    for i, lp in enumerate(result.logprobs):
        assert lp is not None
        assert lp.token_id == result.token_ids[i]
        assert lp.logprob == pytest.approx(expected[i, lp.token_id].item(), abs=1e-5)
        assert [t for t, _ in lp.top] == expected[i].topk(3).indices.tolist()
        assert lp.top[0][0] == lp.token_id


def test_top_k_one_equals_greedy() -> None:
    logits = _logits(5, seed=1)
    rows = [_row(SamplingParams(temperature=1.3, top_k=1), seed=i) for i in range(5)]
    assert Sampler()(logits, rows).token_ids == logits.argmax(dim=-1).tolist()


WARP_CASES = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.5, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.1),
    SamplingParams(temperature=1.2, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.5, top_k=VOCAB),
    SamplingParams(temperature=1.0, top_p=0.3, min_p=0.2),
    SamplingParams(temperature=2.0, top_k=2, top_p=0.99),
]


def test_warpers_match_transformers_row_by_row() -> None:
    logits = _logits(len(WARP_CASES), seed=2)
    rows = [_row(p) for p in WARP_CASES]
    processed = Sampler().process(logits, rows)
    for i, params in enumerate(WARP_CASES):
        _assert_same_distribution(processed[i], _hf_warp(logits[i], params))
    # The transforms really removed tokens, so the comparison covered the masking.
    assert torch.isinf(processed[1]).sum() == VOCAB - 5


def test_repetition_penalty_matches_transformers() -> None:
    logits = _logits(3, seed=3)
    contexts = [([1, 2, 3, 3], [10, 11]), ([250, 5], []), ([], [42, 42, 99])]
    penalties = [1.3, 0.8, 2.0]
    rows = [
        _row(SamplingParams(temperature=0.0, repetition_penalty=p), prompt=c[0], output=c[1])
        for p, c in zip(penalties, contexts, strict=True)
    ]
    processed = Sampler().process(logits, rows)
    for i, (prompt, output) in enumerate(contexts):
        ids = cast(torch.LongTensor, torch.tensor([[*prompt, *output]]))
        expected = RepetitionPenaltyLogitsProcessor(penalties[i])(ids, logits[i : i + 1].clone())
        torch.testing.assert_close(processed[i], expected[0])
        assert not torch.equal(processed[i], logits[i])


def test_presence_and_frequency_penalties_follow_openai() -> None:
    logits = _logits(2, seed=4)
    output = [5, 5, 5, 9]
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.25)
    rows = [_row(params, prompt=[9, 100], output=output), _row(SamplingParams(temperature=0.0))]
    processed = Sampler().process(logits, rows)
    expected = logits[0].clone()
    expected[5] -= 3 * 0.25 + 0.5
    expected[9] -= 1 * 0.25 + 0.5  # prompt occurrences do not count
    torch.testing.assert_close(processed[0], expected)
    torch.testing.assert_close(processed[1], logits[1])


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_p=0.6),
        SamplingParams(temperature=1.0, min_p=0.3),
        SamplingParams(temperature=0.8, top_k=4, top_p=0.9),
    ],
)
def test_filters_never_draw_a_masked_token(params: SamplingParams) -> None:
    base = _logits(1, seed=5, scale=2.0)
    allowed_logits = _hf_warp(base[0], params)
    allowed = set(torch.nonzero(~torch.isinf(allowed_logits)).flatten().tolist())
    assert 1 < len(allowed) < VOCAB
    draws = 4000
    rows = [_row(params, seed=1000 + i) for i in range(draws)]
    tokens = Sampler()(base.expand(draws, VOCAB), rows).token_ids
    assert set(tokens) <= allowed
    # And the draws follow the filtered distribution, not just its support.
    expected = allowed_logits.softmax(dim=-1)
    counts = Counter(tokens)
    for token in allowed:
        assert counts[token] / draws == pytest.approx(expected[token].item(), abs=0.03)


def test_same_seed_same_tokens_alone_or_batched() -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=1234)
    others = [SamplingParams(temperature=0.7, seed=7), SamplingParams(temperature=1.0, top_k=3)]
    sampler = Sampler()
    alone = _row(params)
    batched = [_row(others[0]), _row(params), _row(others[1])]
    alone_tokens, batched_tokens = [], []
    for step in range(12):
        step_logits = _logits(3, seed=100 + step, scale=1.0)
        alone_tokens.append(sampler(step_logits[1:2], [alone]).token_ids[0])
        batched_tokens.append(sampler(step_logits, batched).token_ids[1])
    assert alone_tokens == batched_tokens
    again = _row(params)
    other_seed = _row(SamplingParams(temperature=1.0, top_p=0.95, seed=4321))
    repeat, different = [], []
    for step in range(12):
        step_logits = _logits(3, seed=100 + step, scale=1.0)
        repeat.append(sampler(step_logits[1:2], [again]).token_ids[0])
        different.append(sampler(step_logits[1:2], [other_seed]).token_ids[0])
    assert repeat == alone_tokens
    assert different != alone_tokens


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    logits = _logits(1, seed=6)
    logits[0, EOS] = 50.0
    logits[0, 11] = 40.0
    sampler = Sampler(frozenset({EOS}))
    params = SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(11,))
    for produced in range(3):
        token = sampler(logits, [_row(params, output=[1] * produced)]).token_ids[0]
        assert token not in (EOS, 11)
    assert sampler(logits, [_row(params, output=[1, 1, 1])]).token_ids == [EOS]
    ignoring = SamplingParams(temperature=0.0, min_tokens=3, ignore_eos=True)
    assert sampler(logits, [_row(ignoring)]).token_ids == [EOS]


def test_logit_bias_matches_transformers_sequence_bias_before_the_penalties() -> None:
    logits = _logits(3, seed=9)
    biases: list[dict[int, float]] = [
        {3: 5.5, 40: -2.0, VOCAB - 1: 100.0},
        {},
        {7: -100.0, 8: 0.25},
    ]
    prompt = [8, 9]
    rows = [
        _row(SamplingParams(temperature=0.0, logit_bias=biases[0])),
        _row(SamplingParams(temperature=0.0)),
        _row(
            SamplingParams(temperature=0.7, logit_bias=biases[2], repetition_penalty=1.3),
            prompt=prompt,
        ),
    ]
    processed = Sampler().process(logits, rows)
    context = cast(torch.LongTensor, torch.tensor([prompt]))
    for i, bias in enumerate(biases):
        expected = logits[i : i + 1].clone()
        if bias:
            expected = SequenceBiasLogitsProcessor([[[t], b] for t, b in bias.items()])(
                context, expected
            )
        if i == 2:  # vLLM's order: the penalty scales the biased logit
            expected = RepetitionPenaltyLogitsProcessor(1.3)(context, expected)
            expected = TemperatureLogitsWarper(0.7)(context, expected)
        torch.testing.assert_close(processed[i], expected[0])
    assert torch.equal(processed[1], logits[1])  # an unbiased row in the batch is untouched
    assert not torch.equal(processed[0], logits[0])


def test_logit_bias_forces_and_bans_tokens_alone_or_batched() -> None:
    logits = _logits(4, seed=10)
    top = logits.argmax(dim=-1).tolist()
    forced = SamplingParams(temperature=0.0, logit_bias={11: 100.0})
    banned = SamplingParams(temperature=1.0, logit_bias={top[1]: -100.0}, logprobs=1)
    plain = SamplingParams(temperature=0.0)
    rows = [_row(forced), _row(banned, seed=5), _row(plain), _row(forced)]
    result = Sampler()(logits, rows)
    assert result.token_ids[0] == result.token_ids[3] == 11
    assert result.token_ids[2] == top[2]
    assert result.token_ids[1] != top[1]
    assert Sampler()(logits[1:2], [_row(banned, seed=5)]).token_ids == [result.token_ids[1]]
    # The logprobs are those of the biased distribution the token was drawn from.
    biased = logits[1].clone()
    biased[top[1]] -= 100.0
    chosen = result.logprobs[1]
    assert chosen is not None
    expected = biased.log_softmax(dim=-1)[chosen.token_id].item()
    assert chosen.logprob == pytest.approx(expected, abs=1e-5)


def test_logprobs_come_from_the_sampled_distribution() -> None:
    logits = _logits(3, seed=7)
    rows = [
        _row(SamplingParams(temperature=0.5, top_k=2, logprobs=5), seed=1),
        _row(SamplingParams(temperature=1.0, logprobs=0), seed=2),
        _row(SamplingParams(temperature=1.0), seed=3),
    ]
    result = Sampler()(logits, rows)
    first, second, third = result.logprobs
    assert first is not None and second is not None and third is None
    assert len(first.top) == 2  # masked alternatives are left out
    probs = sum(torch.tensor(v).exp().item() for _, v in first.top)
    assert probs == pytest.approx(1.0, abs=1e-5)
    assert first.token_id in {t for t, _ in first.top}
    assert [v for _, v in first.top] == sorted((v for _, v in first.top), reverse=True)
    assert second.top == []
    expected = logits[1].log_softmax(dim=-1)[second.token_id].item()
    assert second.logprob == pytest.approx(expected, abs=1e-5)


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="one row per SamplingRow"):
        Sampler()(_logits(2), [_row(SamplingParams())])
    assert Sampler()(torch.empty(0, VOCAB), []).token_ids == []
    assert make_generator(None, "cpu") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_seeded_sampling_on_cuda_matches_alone_and_batched() -> None:
    device = torch.device("cuda")
    params = SamplingParams(temperature=0.9, top_k=50, top_p=0.9, seed=99, logprobs=2)
    logits = _logits(4, seed=8, scale=1.0).to(device)

    def row() -> SamplingRow:
        return SamplingRow(params, [1, 2], [3], make_generator(params.seed, device))

    others = [SamplingRow(SamplingParams(temperature=0.0), [], [], None) for _ in range(3)]
    alone = Sampler()(logits[2:3], [row()])
    batched = Sampler()(logits, [others[0], others[1], row(), others[2]])
    assert alone.token_ids[0] == batched.token_ids[2]
    assert batched.token_ids[0] == logits[0].argmax().item()
    first = alone.logprobs[0]
    assert first is not None and len(first.top) == 2


def _chi_square(counts: Counter[int], probs: torch.Tensor, draws: int) -> tuple[float, int]:
    """Pearson's statistic over the tokens with mass, and its degrees of freedom."""
    support = torch.nonzero(probs > 0).flatten().tolist()
    stat = sum(
        (counts[t] - draws * probs[t].item()) ** 2 / (draws * probs[t].item()) for t in support
    )
    return stat, len(support) - 1


def _zero_holed_probs() -> torch.Tensor:
    """A skewed distribution with zeros at the ends and in between (as masks leave them)."""
    weights = torch.rand(40, generator=torch.Generator().manual_seed(3)) ** 3
    weights[[0, 1, 5, 17, 18, 30, 38, 39]] = 0.0
    return weights / weights.sum()


def test_inverse_cdf_frequencies_match_the_probabilities() -> None:
    probs = _zero_holed_probs()
    draws = 50_000
    torch.manual_seed(1234)  # unseeded rows: the global generator, fixed for the test
    tokens = sample_from_probs(probs.expand(draws, -1).contiguous(), [None] * draws).tolist()
    counts = Counter(tokens)
    stat, dof = _chi_square(counts, probs, draws)
    # mean dof, sd sqrt(2 dof): six standard deviations fail only on a broken sampler
    assert stat < dof + 6 * (2 * dof) ** 0.5, (stat, dof)
    assert all(probs[t] > 0 for t in counts), "a zero-probability token was drawn"


def test_inverse_cdf_seeded_rows_follow_the_probabilities_and_repeat() -> None:
    probs = _zero_holed_probs()
    draws = 20_000
    generators = [make_generator(seed, "cpu") for seed in range(draws)]
    tokens = sample_from_probs(probs.expand(draws, -1).contiguous(), generators).tolist()
    stat, dof = _chi_square(Counter(tokens), probs, draws)
    assert stat < dof + 6 * (2 * dof) ** 0.5, (stat, dof)
    again = [make_generator(seed, "cpu") for seed in range(draws)]
    assert sample_from_probs(probs.expand(draws, -1).contiguous(), again).tolist() == tokens


def test_inverse_cdf_never_draws_zero_mass_even_at_the_edges() -> None:
    """All mass on one token at the start, in the middle, at the end; rows with unnormalized
    totals (a cumsum that rounds) too: only tokens with mass ever come out."""
    vocab = 64
    probs = torch.zeros(6, vocab)
    probs[0, 0] = 1.0
    probs[1, 31] = 1.0
    probs[2, vocab - 1] = 1.0
    probs[3, [2, 60]] = torch.tensor([1e-30, 1.0])  # a tail token with nearly no mass
    probs[4, 10:20] = 0.1
    probs[5, :] = torch.rand(vocab, generator=torch.Generator().manual_seed(0)) * 1e-3
    probs[5, [0, vocab - 1]] = 0.0
    batch = probs.repeat(2000, 1)
    torch.manual_seed(7)
    tokens = sample_from_probs(batch, [None] * batch.shape[0])
    assert bool((batch.gather(1, tokens.unsqueeze(1)) > 0).all())
    assert set(tokens[0::6].tolist()) == {0}
    assert set(tokens[1::6].tolist()) == {31}
    assert set(tokens[2::6].tolist()) == {vocab - 1}
    assert set(tokens[4::6].tolist()) == set(range(10, 20))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.0, top_p=0.5),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05),
    ],
)
def test_top_k_top_p_masked_tokens_are_never_drawn_unseeded(params: SamplingParams) -> None:
    base = _logits(1, seed=11, scale=2.0)
    allowed_logits = _hf_warp(base[0], params)
    allowed = set(torch.nonzero(~torch.isinf(allowed_logits)).flatten().tolist())
    draws = 20_000
    torch.manual_seed(99)
    tokens = Sampler()(base.expand(draws, VOCAB), [_row(params) for _ in range(draws)]).token_ids
    assert set(tokens) <= allowed
    stat, dof = _chi_square(Counter(tokens), allowed_logits.softmax(dim=-1), draws)
    if dof:
        assert stat < dof + 6 * (2 * dof) ** 0.5, (stat, dof)


@pytest.mark.parametrize(
    "batch",
    [
        [SamplingParams(temperature=0.0)] * 3,
        [SamplingParams(temperature=1.0, seed=11), SamplingParams(temperature=1.0, seed=12)],
        [SamplingParams(temperature=0.6, seed=5), SamplingParams(temperature=1.3, seed=6)],
        [SamplingParams(temperature=0.8, seed=3, min_tokens=2, ignore_eos=True)],
    ],
)
def test_rows_drawn_as_is_get_the_general_paths_tokens(batch: list[SamplingParams]) -> None:
    """Rows asking for nothing but a temperature skip the general path's copies and
    gathers; a zero logit bias (which changes no logit) sends the same rows through
    the general path, and every step's tokens, seeded draws included, are the same."""
    sampler = Sampler(eos_token_ids={EOS})
    plain = [_row(p) for p in batch]
    general = [_row(dataclasses.replace(p, logit_bias=((0, 0.0),))) for p in batch]
    assert all(sampler._as_is(row) for row in plain)
    assert not any(sampler._as_is(row) for row in general)
    for step in range(20):
        step_logits = _logits(len(batch), seed=300 + step, scale=2.0)
        assert sampler(step_logits, plain).token_ids == sampler(step_logits, general).token_ids


def test_a_pending_min_tokens_mask_or_a_filter_takes_the_general_path() -> None:
    sampler = Sampler(eos_token_ids={EOS})
    assert not sampler._as_is(_row(SamplingParams(temperature=0.0, min_tokens=3)))
    assert not sampler._as_is(_row(SamplingParams(temperature=1.0, top_p=0.9)))
    assert not sampler._as_is(_row(SamplingParams(temperature=1.0, top_k=5)))
    assert not sampler._as_is(_row(SamplingParams(temperature=1.0, min_p=0.1)))
    assert not sampler._as_is(_row(SamplingParams(temperature=0.0, logprobs=2)))
    assert not sampler._as_is(_row(SamplingParams(temperature=0.0, presence_penalty=0.5)))
