"""Embeddings (`SamplingParams.embed`): the final hidden state of the prompt's last token,
L2-normalized, equal to transformers' own `last_hidden_state` whether the prompt runs in
one step or in chunks, beside generating requests, after a prefix-cache hit, or as a
one-token prompt (which the runner lays out like a decode); nothing is generated, and a
Matryoshka model's cut is checked against what its config allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import (
    EngineTracker,
    build_tiny_model,
    hf_config,
    hf_greedy,
    load_hf_model,
    random_prompts,
    run_batch,
    tokenizer_files,
)

from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import InvalidRequestError, UnsupportedModelError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EMBED = SamplingParams(max_tokens=0, embed=True)


@pytest.fixture(scope="module", params=["gqa", "qwen2", "qwen3"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("embed"), request.param, seed=21)


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> torch.nn.Module:
    return load_hf_model(model_dir)


def _expected(model: torch.nn.Module, prompt: list[int], dims: int | None = None) -> torch.Tensor:
    """transformers: the base model's last hidden state (after the final norm), last token."""
    with torch.inference_mode():
        hidden = model.model(torch.tensor([prompt])).last_hidden_state[0, -1].float()
    return torch.nn.functional.normalize(hidden[:dims], dim=0)


def _embedding(outputs: list[RequestOutput]) -> torch.Tensor:
    """The one output of an embedding request: finished, nothing generated, the vector."""
    (only,) = outputs
    assert only.finished and only.embedding is not None
    assert only.metrics.completion_tokens == 0
    assert only.outputs[0].token_ids == [] and only.outputs[0].finish_reason == "stop"
    return torch.tensor(only.embedding)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    assert float(got.norm()) == pytest.approx(1.0, abs=1e-5)
    assert float((got - want).norm()) < 1e-4


def test_embeddings_match_transformers_beside_generation(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompts = [*random_prompts(4, 1, 60, seed=3), [7]]  # a one-token prompt too
    generate = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    params = [EMBED, generate, EMBED, EMBED, EMBED]
    outputs = run_batch(engine, prompts, params)
    for i in (0, 2, 3, 4):
        _close(_embedding(outputs[i]), _expected(reference, prompts[i]))
    generated = outputs[1][-1]
    assert generated.embedding is None and len(generated.outputs[0].token_ids) == 4


def test_a_chunked_prompt_is_pooled_at_its_last_chunk(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    """13 tokens a step: only the step that computes the last token yields the vector."""
    engine = engines.make(
        model_dir, max_num_batched_tokens=13, short_lane_tokens=13, long_lane_tokens=13
    )
    prompt = random_prompts(1, 70, 71, seed=4)[0]
    outputs = run_batch(engine, [prompt], [EMBED])
    _close(_embedding(outputs[0]), _expected(reference, prompt))


def test_a_cached_prefix_gives_the_same_embedding(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompt = random_prompts(1, 50, 51, seed=6)[0]
    first = _embedding(run_batch(engine, [prompt], [EMBED])[0])
    again = run_batch(engine, [prompt], [EMBED])[0]
    assert again[-1].metrics.cached_tokens > 0  # the first one's full blocks were reused
    _close(_embedding(again), first)
    _close(first, _expected(reference, prompt))


def test_a_prompt_may_fill_the_context(model_dir: Path, engines: EngineTracker) -> None:
    """Nothing is generated, so no token has to be left over; one more is refused."""
    engine = engines.make(model_dir, max_model_len=64)
    full = random_prompts(1, 64, 65, seed=7)[0]
    assert len(_embedding(run_batch(engine, [full], [EMBED])[0])) > 0
    with pytest.raises(InvalidRequestError, match="maximum context length") as refused:
        engine.add_request(Request("too-long", [*full, 5], EMBED))
    assert refused.value.param == "input"


def _with_config(model_dir: Path, out: Path, **keys: object) -> Path:
    """A copy of the model whose config.json gains `keys` (the weights are linked)."""
    out.mkdir()
    for item in model_dir.iterdir():
        (out / item.name).symlink_to(item)
    (out / "config.json").unlink()
    config = json.loads((model_dir / "config.json").read_text()) | keys
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_dimensions_cut_only_a_matryoshka_model(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker, tmp_path: Path
) -> None:
    hidden = reference.config.hidden_size
    plain = engines.make(model_dir)
    whole = SamplingParams(max_tokens=0, embed=True, embed_dimensions=hidden)
    assert len(_embedding(run_batch(plain, [[4, 5, 6]], [whole])[0])) == hidden
    for dims, message in [(16, "not trained to be cut"), (hidden + 1, "exceeds")]:
        cut = SamplingParams(max_tokens=0, embed=True, embed_dimensions=dims)
        with pytest.raises(InvalidRequestError, match=message) as refused:
            plain.add_request(Request(f"cut-{dims}", [4, 5, 6], cut))
        assert refused.value.param == "dimensions"
    listed = engines.make(_with_config(model_dir, tmp_path / "m", matryoshka_dimensions=[16, 32]))
    prompt = random_prompts(1, 10, 30, seed=8)[0]
    cut = SamplingParams(max_tokens=0, embed=True, embed_dimensions=16)
    _close(_embedding(run_batch(listed, [prompt], [cut])[0]), _expected(reference, prompt, 16))
    unlisted = SamplingParams(max_tokens=0, embed=True, embed_dimensions=24)
    with pytest.raises(InvalidRequestError, match="one of 16, 32"):
        listed.add_request(Request("cut-24", prompt, unlisted))
    free = engines.make(_with_config(model_dir, tmp_path / "f", is_matryoshka=True))
    _close(_embedding(run_batch(free, [prompt], [unlisted])[0]), _expected(reference, prompt, 24))


@pytest.mark.parametrize(
    ("settings", "param"),
    [
        ({"max_tokens": 1}, "max_tokens"),
        ({"n": 2}, "n"),
        ({"logprobs": 1}, "logprobs"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"structured_output": ("regex", "a+")}, "structured_outputs"),
        ({"embed_dimensions": 0}, "dimensions"),
        ({"embed": "yes"}, "embed"),
    ],
)
def test_what_an_embedding_cannot_be_combined_with(settings: dict, param: str) -> None:
    params = SamplingParams(**{"max_tokens": 0, "embed": True, **settings})
    with pytest.raises(InvalidRequestError) as refused:
        params.validate(vocab_size=100)
    assert refused.value.param == param


def test_dimensions_without_embed_are_refused() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(embed_dimensions=8).validate()
    assert refused.value.param == "dimensions"


def _save_bare_decoder(config: Any, out: Path) -> torch.nn.Module:
    """transformers' bare decoder (`AutoModel`: no LM head, names without `model.`) of a
    random model, saved with the demo tokenizer, as embedding models ship."""
    from transformers import AutoModel

    bare = AutoModel.from_config(config).eval()
    bare.save_pretrained(out)
    for name, text in tokenizer_files().items():
        (out / name).write_text(text, "utf-8")
    return bare


def _embeds_as(bare: torch.nn.Module, engine: LLMEngine, prompts: list[list[int]]) -> None:
    """The engine's vectors are `bare`'s last hidden state of each prompt, normalized."""
    outputs = run_batch(engine, prompts, [EMBED] * len(prompts))
    for i, prompt in enumerate(prompts):
        with torch.inference_mode():
            hidden = bare(torch.tensor([prompt])).last_hidden_state[0, -1].float()
        _close(_embedding(outputs[i]), torch.nn.functional.normalize(hidden, dim=0))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_bare_decoder_checkpoint_serves_embeddings_only(
    family: str, engines: EngineTracker, tmp_path: Path
) -> None:
    """An embedding model as e5-mistral ships it: `LlamaModel`-style architecture, tensor
    names without `model.`, no LM head. Its vectors match transformers' own `AutoModel`;
    a generation request is refused, naming the model."""
    torch.manual_seed(5)
    bare = _save_bare_decoder(hf_config(family), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"][0].endswith("Model")
    engine = engines.make(tmp_path)
    assert engine.model_config.embedding_only
    prompts = random_prompts(3, 5, 40, seed=12)
    _embeds_as(bare, engine, prompts)
    with pytest.raises(InvalidRequestError, match="embeddings only") as refused:
        engine.add_request(Request("generate", prompts[0], SamplingParams(max_tokens=2)))
    assert refused.value.param == "model"


@pytest.mark.parametrize("tied", [False, True])
def test_a_causal_lm_config_over_bare_decoder_weights(
    tied: bool, engines: EngineTracker, tmp_path: Path
) -> None:
    """As Qwen3-Embedding ships: `config.json` says `Qwen3ForCausalLM`, the weights are the
    bare decoder's (names without `model.`, no `lm_head`). Untied, there is no head to
    generate with: embeddings only. Tied, the head is the embedding table, so it also
    generates, greedily as transformers does from the same files."""
    torch.manual_seed(6)
    config = hf_config("qwen3")
    config.tie_word_embeddings = tied
    bare = _save_bare_decoder(config, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written["architectures"] = ["Qwen3ForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(written))
    engine = engines.make(tmp_path)
    assert engine.model_config.embedding_only is not tied
    prompts = random_prompts(2, 5, 30, seed=13)
    _embeds_as(bare, engine, prompts)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    if not tied:
        with pytest.raises(InvalidRequestError, match="embeddings only"):
            engine.add_request(Request("generate", prompts[0], greedy))
        return
    reference = load_hf_model(tmp_path)
    final = run_batch(engine, prompts[:1], [greedy])[0][-1]
    assert final.finished
    assert final.outputs[0].token_ids == hf_greedy(reference, prompts[0], 6)


def _with_pooling(model_dir: Path, out: Path, mode: str) -> Path:
    """A copy with sentence-transformers' files: `modules.json` and the Pooling config."""
    for path in model_dir.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    modes = ("cls_token", "mean_tokens", "max_tokens", "lasttoken")
    settings = {f"pooling_mode_{m}": m == mode for m in modes}
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **settings})
    )
    return out


@pytest.mark.parametrize("mode", ["mean_tokens", "cls_token"])
def test_a_declared_pooling_is_the_one_used(
    mode: str, model_dir: Path, reference: torch.nn.Module, engines: EngineTracker, tmp_path: Path
) -> None:
    """Mean or first-token pooling, as the checkpoint's sentence-transformers config says:
    equal to transformers' hidden states pooled so, in one step or chunk by chunk (13
    tokens a step), and when the same prompt comes again (its blocks are not reused: they
    hold K/V, not the hidden states a mean needs)."""
    pooled_dir = _with_pooling(model_dir, tmp_path, mode)
    one_step = engines.make(pooled_dir)
    assert one_step.model_config.pooling == {"mean_tokens": "mean", "cls_token": "cls"}[mode]
    chunked = engines.make(
        pooled_dir, max_num_batched_tokens=13, short_lane_tokens=13, long_lane_tokens=13
    )
    prompts = [*random_prompts(2, 30, 70, seed=8), [9]]
    for prompt in prompts:
        with torch.inference_mode():
            states = reference.model(torch.tensor([prompt])).last_hidden_state[0].float()
        pooled = states.mean(dim=0) if mode == "mean_tokens" else states[0]
        want = torch.nn.functional.normalize(pooled, dim=0)
        for engine in (one_step, chunked, chunked):  # the second time, after the first
            again = run_batch(engine, [prompt], [EMBED])[0]
            assert again[-1].metrics.cached_tokens == 0
            _close(_embedding(again), want)
    # Beside a request that generates, in one batch.
    generate = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    mixed = run_batch(chunked, prompts, [EMBED, generate, EMBED])
    assert len(mixed[1][-1].outputs[0].token_ids) == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"pooling_mode_max_tokens": True}, "pooling_mode_max_tokens"),
        ({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "not supported"),
    ],
)
def test_a_pooling_hydrant_cannot_do_is_refused_at_load(
    settings: dict[str, bool], message: str, model_dir: Path, tmp_path: Path
) -> None:
    pooled_dir = _with_pooling(model_dir, tmp_path, "lasttoken")
    (pooled_dir / "1_Pooling" / "config.json").write_text(json.dumps(settings))
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_pretrained(pooled_dir)


def test_a_mean_pooled_prompt_preempted_midway_starts_its_sum_again(
    model_dir: Path, reference: torch.nn.Module, engines: EngineTracker, tmp_path: Path
) -> None:
    """Under a KV budget so small that chunked prompts are preempted and recomputed, the
    mean counts each prompt token once."""
    engine = engines.make(
        _with_pooling(model_dir, tmp_path, "mean_tokens"),
        num_gpu_blocks=20,
        max_num_batched_tokens=13,
        short_lane_tokens=13,
        long_lane_tokens=13,
    )
    # Two generating requests arrive first and fill most of the cache; as they grow, the
    # later prompts, still computing chunk by chunk, are the ones preempted.
    prompts = [*random_prompts(2, 120, 121, seed=9), *random_prompts(2, 100, 101, seed=10)]
    generate = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    params = [generate, generate, EMBED, EMBED]
    outputs = run_batch(engine, prompts, params)
    embedded = [i for i, p in enumerate(params) if p is EMBED]
    assert any(outputs[i][-1].metrics.num_preemptions > 0 for i in embedded)
    for i in embedded:
        with torch.inference_mode():
            states = reference.model(torch.tensor([prompts[i]])).last_hidden_state[0].float()
        _close(_embedding(outputs[i]), torch.nn.functional.normalize(states.mean(dim=0), dim=0))
