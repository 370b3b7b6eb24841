"""The demo checkpoint: deterministic, loadable and runnable by transformers as a Llama."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from hydrant.engine.demo_model import SPECIAL_TOKENS, write_demo_model
from hydrant.engine.tokenizer import Tokenizer

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)


def _hashes(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FILES}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_model(tmp_path_factory.mktemp("demo") / "model")


def test_same_seed_gives_byte_identical_files(demo_dir: Path, tmp_path: Path) -> None:
    messages: list[str] = []
    again = write_demo_model(tmp_path / "again", seed=0, progress=messages.append)
    assert _hashes(again) == _hashes(demo_dir)
    assert len(messages) >= 2
    other = write_demo_model(tmp_path / "other", seed=1)
    other_hashes = _hashes(other)
    assert other_hashes["model.safetensors"] != _hashes(demo_dir)["model.safetensors"]
    assert other_hashes["tokenizer.json"] == _hashes(demo_dir)["tokenizer.json"]


def test_layout_matches_hf_llama(demo_dir: Path) -> None:
    config = json.loads((demo_dir / "config.json").read_text("utf-8"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 4)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["tie_word_embeddings"] is False
    tokenizer = Tokenizer.from_pretrained(demo_dir)
    assert config["vocab_size"] == tokenizer.vocab_size == 2048
    expected = LlamaForCausalLM(LlamaConfig(**config)).state_dict()
    with safe_open(str(demo_dir / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        assert names == set(expected)
        for name in names:
            tensor = f.get_tensor(name)
            assert tensor.shape == expected[name].shape, name
            assert tensor.dtype == torch.float32
        q = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
        assert q.std().item() == pytest.approx(0.02, rel=0.05)
        assert torch.equal(f.get_tensor("model.norm.weight"), torch.ones(128))
    generation = json.loads((demo_dir / "generation_config.json").read_text("utf-8"))
    eos = {tokenizer.token_to_id("<|end_of_text|>"), tokenizer.token_to_id("<|eot_id|>")}
    assert set(generation["eos_token_id"]) == eos
    assert tokenizer.eos_token_ids == frozenset(eos)
    assert all(tokenizer.token_to_id(t) in tokenizer.special_token_ids for t in SPECIAL_TOKENS)


def test_transformers_loads_and_generates(demo_dir: Path) -> None:
    hf_tokenizer = AutoTokenizer.from_pretrained(demo_dir)
    model = AutoModelForCausalLM.from_pretrained(demo_dir)
    ours = Tokenizer.from_pretrained(demo_dir)
    conversation = [
        {"role": "system", "content": "You are a lighthouse keeper."},
        {"role": "user", "content": "How many boats came back? 🚤 今天呢？"},
    ]
    expected_text = hf_tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    assert ours.apply_chat_template(conversation) == expected_text
    prompt_ids = ours.encode_chat(conversation)
    assert prompt_ids == hf_tokenizer.apply_chat_template(
        conversation, add_generation_prompt=True, return_dict=False
    )
    assert prompt_ids[0] == ours.bos_token_id
    inputs = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
        )
    new_tokens = out[0, len(prompt_ids) :].tolist()
    assert len(new_tokens) == 8
    assert all(0 <= t < ours.vocab_size for t in new_tokens)
    assert ours.decode(new_tokens) == hf_tokenizer.decode(new_tokens, skip_special_tokens=True)
