"""The wire form of sampling settings mirrors the engine's: same fields, same defaults."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec

from hydrant.engine.protocol import Sampling
from hydrant.engine.sampling_params import SamplingParams


def test_sampling_wire_form_matches_sampling_params() -> None:
    engine_fields = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    wire_fields = dict(zip(Sampling.__struct_fields__, Sampling.__struct_defaults__, strict=True))
    assert wire_fields == engine_fields


def test_round_trip_keeps_every_value() -> None:
    fields: dict[str, Any] = {
        "n": 2,
        "max_tokens": 7,
        "temperature": 0.5,
        "top_k": 3,
        "seed": 11,
        "stop": ("x",),
        "logprobs": 2,
        "logit_bias": ((4, -100.0), (17, 2.5)),
        "structured_output": ("regex", "[0-9]+"),
    }
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(Sampling(**fields)), type=Sampling)
    assert wire == Sampling(**fields)
    assert wire.to_params() == SamplingParams(**fields)
