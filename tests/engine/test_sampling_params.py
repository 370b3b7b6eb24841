"""SamplingParams.validate: every bad value is refused with the OpenAI parameter's name."""

from __future__ import annotations

import math
from typing import Any

import pytest

from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.sampling_params import SamplingParams

BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"n": 0}, "n", ">= 1"),
    ({"max_tokens": 0}, "max_tokens", ">= 1"),
    ({"max_tokens": 2.5}, "max_tokens", "integer"),
    ({"min_tokens": -1}, "min_tokens", ">= 0"),
    ({"min_tokens": 20, "max_tokens": 10}, "min_tokens", "exceed"),
    ({"temperature": math.nan}, "temperature", "finite"),
    ({"temperature": -0.1}, "temperature", ">= 0"),
    ({"temperature": math.inf}, "temperature", "finite"),
    ({"top_p": 0.0}, "top_p", "(0, 1]"),
    ({"top_p": 1.5}, "top_p", "(0, 1]"),
    ({"top_p": math.nan}, "top_p", "(0, 1]"),
    ({"top_k": -1}, "top_k", ">= 0"),
    ({"min_p": 1.5}, "min_p", "[0, 1]"),
    ({"repetition_penalty": 0.0}, "repetition_penalty", "> 0"),
    ({"presence_penalty": 2.5}, "presence_penalty", "[-2.0, 2.0]"),
    ({"frequency_penalty": -3}, "frequency_penalty", "[-2.0, 2.0]"),
    ({"stop": ("",)}, "stop", "empty"),
    ({"stop": (1,)}, "stop", "strings"),
    ({"stop_token_ids": (-3,)}, "stop_token_ids", "non-negative"),
    ({"seed": 2**70}, "seed", "integer"),
    ({"seed": True}, "seed", "integer"),
    ({"logprobs": 21}, "logprobs", "[0, 20]"),
    ({"logprobs": -1}, "logprobs", "[0, 20]"),
    ({"ignore_eos": "yes"}, "ignore_eos", "boolean"),
]


@pytest.mark.parametrize(("fields", "param", "fragment"), BAD)
def test_invalid_values_name_their_parameter(
    fields: dict[str, Any], param: str, fragment: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**fields).validate()
    assert info.value.param == param
    assert fragment in info.value.message
    assert isinstance(info.value, EngineError)


def test_vocab_size_bounds_token_ids_and_top_k() -> None:
    SamplingParams(stop_token_ids=(99,), top_k=100).validate(vocab_size=100)
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(stop_token_ids=(100,)).validate(vocab_size=100)
    assert info.value.param == "stop_token_ids"
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(top_k=101).validate(vocab_size=100)
    assert info.value.param == "top_k"


def test_defaults_and_edge_values_are_valid() -> None:
    SamplingParams().validate()
    SamplingParams(
        temperature=0,
        top_p=1,
        min_p=1.0,
        presence_penalty=-2.0,
        frequency_penalty=2.0,
        seed=-(2**63),
        logprobs=0,
        min_tokens=16,
    ).validate()
    assert SamplingParams(temperature=0).is_greedy
    assert not SamplingParams().is_greedy


def test_lists_and_a_single_stop_string_become_tuples() -> None:
    params = SamplingParams(stop=["a", "bcd"], stop_token_ids=[1, 2])
    assert params.stop == ("a", "bcd")
    assert params.stop_token_ids == (1, 2)
    assert params.max_stop_len == 3
    assert SamplingParams(stop="END").stop == ("END",)
    assert hash(params) == hash(SamplingParams(stop=("a", "bcd"), stop_token_ids=(1, 2)))
