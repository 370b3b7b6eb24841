"""`hydrant models quantize`: a real offline quantization, not a placeholder.

The engine-level proof (the output serves without re-quantizing, with the
same logits as quantizing on load) is in tests/engine/test_quantized_engine.py;
here the command's own contract: what it writes, what it prints, what it refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from hydrant.cli.main import cli
from hydrant.engine.demo_model import write_demo_tokenizer
from hydrant.kernels.quantization import read_quantization_manifest


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random float32 Llama in the Hugging Face layout, with the demo tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("float")
    LlamaForCausalLM(config).save_pretrained(out)
    write_demo_tokenizer(out)
    return out


def quantize(src: Path, dst: Path, mode: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["models", "quantize", str(src), str(dst), "--mode", mode])
    return result.exit_code, result.stdout, result.stderr


def test_int8_writes_a_self_contained_quantized_checkpoint(float_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "int8"
    code, out, err = quantize(float_dir, dst, "int8")
    assert code == 0, out + err
    manifest = read_quantization_manifest(dst)
    assert manifest is not None and manifest.mode == "int8"
    # the engine's fused linears: qkv, o, gate_up, down in each of the 2 layers
    assert len(manifest.modules) == 8
    assert "model.layers.0.self_attn.qkv_proj" in manifest.modules
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (dst / name).read_bytes() == (float_dir / name).read_bytes(), name
    assert sorted(p.name for p in dst.glob("*.safetensors")) == ["model.safetensors"]
    assert "loading" in err and "quantizing to int8" in err
    assert "quantized 8 linear layers to int8 (1 kept in float)" in out
    line = next(x for x in out.splitlines() if x.startswith("linear weight bytes:"))
    before, after = (int(v) for v in line.split(":")[1].split("(")[0].split("->"))
    # float32 weights to int8 codes plus float32 per-row scales: just over a quarter
    assert 0.25 < after / before < 0.3
    assert (dst / "model.safetensors").stat().st_size < (
        float_dir / "model.safetensors"
    ).stat().st_size


def test_int4_quantizes_layers_the_group_size_divides(float_dir: Path, tmp_path: Path) -> None:
    # group size 128: only down_proj (in_features 128) divides; the rest stay float and say so
    code, out, err = quantize(float_dir, tmp_path / "int4", "int4")
    assert code == 0, out + err
    manifest = read_quantization_manifest(tmp_path / "int4")
    assert manifest is not None and manifest.mode == "int4" and manifest.group_size == 128
    assert sorted(manifest.modules) == [f"model.layers.{i}.mlp.down_proj" for i in range(2)]
    assert "quantized 2 linear layers to int4 (7 kept in float)" in out


def test_refuses_a_non_empty_destination(float_dir: Path, tmp_path: Path) -> None:
    dst = tmp_path / "taken"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    code, _, err = quantize(float_dir, dst, "int8")
    assert code == 2
    assert "not an empty directory" in err
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]


def test_refuses_to_quantize_twice(float_dir: Path, tmp_path: Path) -> None:
    code, _, _ = quantize(float_dir, tmp_path / "once", "int8")
    assert code == 0
    code, _, err = quantize(tmp_path / "once", tmp_path / "twice", "int8")
    assert code == 2
    assert "already a quantized checkpoint" in err
    assert not (tmp_path / "twice").exists()
