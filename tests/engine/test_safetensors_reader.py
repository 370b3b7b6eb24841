"""The preadv safetensors reader against the safetensors library, and its refusals."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hydrant.engine.errors import MissingWeightError, ModelLoadError
from hydrant.engine.safetensors_reader import SafetensorsFile

TENSORS = {
    "a.f32": torch.randn(300, 70),
    "b.bf16": torch.randn(33).to(torch.bfloat16),
    "c.f16": torch.randn(4, 5, 6).to(torch.float16),
    "d.i64": torch.arange(10),
    "e.u8": torch.arange(7, dtype=torch.uint8),
    "f.scalar": torch.tensor(2.5),
    "g.empty": torch.empty(0, 3),
}


def test_reads_every_dtype_like_the_safetensors_library(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    save_file(TENSORS, str(path), metadata={"format": "pt"})
    reference = load_file(str(path))
    with SafetensorsFile(path) as reader:
        assert {e.name for e in reader.entries} == set(TENSORS)
        offsets = [e.offset for e in reader.entries]
        assert offsets == sorted(offsets)  # file order
        for entry in reader.entries:
            got = reader.read(entry)
            assert got.dtype == reference[entry.name].dtype
            assert torch.equal(got, reference[entry.name]), entry.name


def test_read_into_refuses_a_tensor_that_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    save_file({"w": torch.ones(4, 4)}, str(path))
    with SafetensorsFile(path) as reader:
        (entry,) = reader.entries
        with pytest.raises(ValueError, match="do not fit"):
            reader.read_into(entry, torch.empty(5, 4))
        with pytest.raises(ValueError, match="dtype"):
            reader.read_into(entry, torch.empty(4, 4, dtype=torch.float16))
        with pytest.raises(ValueError, match="contiguous"):
            reader.read_into(entry, torch.empty(4, 8)[:, :4])


def _raw(path: Path, header: object, payload: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + payload)
    return path


@pytest.mark.parametrize(
    ("header", "payload", "why"),
    [
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, "offsets"),
        ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "offsets"),
        ({"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, "malformed"),
        ({"w": {"shape": [2]}}, b"", "malformed"),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_malformed_files_are_a_clear_load_error(
    tmp_path: Path, header: object, payload: bytes, why: str
) -> None:
    path = _raw(tmp_path / "bad.safetensors", header, payload)
    with pytest.raises(ModelLoadError, match=why):
        SafetensorsFile(path)


def test_truncated_and_garbage_files(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\1\2")
    with pytest.raises(ModelLoadError, match="8-byte"):
        SafetensorsFile(short)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ModelLoadError, match="does not fit"):
        SafetensorsFile(huge)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"\xff\xfe{]")
    with pytest.raises(ModelLoadError, match="not JSON"):
        SafetensorsFile(garbage)


def test_loader_converts_dtypes_and_names_a_wrong_shape(tmp_path: Path) -> None:
    """A float16 checkpoint loads as float32 equal to the library's upcast; a tensor of
    the wrong shape is named with both shapes."""
    from tiny_models import build_tiny_model

    from hydrant.engine.config import ModelConfig
    from hydrant.engine.loader import load_model

    model_dir = build_tiny_model(tmp_path / "m", "gqa", seed=2)
    weights = load_file(str(model_dir / "model.safetensors"))
    half = {k: v.to(torch.float16) for k, v in weights.items()}
    save_file(half, str(model_dir / "model.safetensors"))
    config = ModelConfig.from_pretrained(model_dir)
    model = load_model(model_dir, config, "cpu", torch.float32, 64, show_progress=False)
    state = model.state_dict()
    assert state["model.norm.weight"].dtype == torch.float32
    assert torch.equal(state["model.norm.weight"], half["model.norm.weight"].float())
    qkv = state["model.layers.0.self_attn.qkv_proj.weight"]
    prefix = "model.layers.0.self_attn."
    expected = torch.cat([half[prefix + f"{p}_proj.weight"].float() for p in "qkv"])
    assert torch.equal(qkv, expected)

    half["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(3, 3, dtype=torch.float16)
    save_file(half, str(model_dir / "model.safetensors"))
    with pytest.raises(MissingWeightError, match=r"k_proj\.weight has shape \(3, 3\)"):
        load_model(model_dir, config, "cpu", torch.float32, 64, show_progress=False)
