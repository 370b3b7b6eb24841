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
    ({"logit_bias": {5: 100.5}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {5: math.nan}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {5: -math.inf}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {-1: 1.0}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias", "token ids"),
    ({"logit_bias": {5: "1"}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": ((5, 1.0), (5, 2.0))}, "logit_bias", "twice"),
    ({"logit_bias": ((5,),)}, "logit_bias", "map token ids"),
    ({"logit_bias": {t: 1.0 for t in range(1025)}}, "logit_bias", "at most 1024"),
    ({"structured_output": ("xml", "<a/>")}, "structured_outputs", "kind one of"),
    ({"structured_output": ("regex",)}, "structured_outputs", "kind one of"),
    ({"structured_output": ("regex", "a+"), "ignore_eos": True}, "ignore_eos", "structured"),
    ({"structured_output": ("json", "{}"), "min_tokens": 2}, "min_tokens", "response_format"),
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
    SamplingParams(logit_bias={99: -100, 0: 100}).validate(vocab_size=100)
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(logit_bias={100: 1.0}).validate(vocab_size=100)
    assert info.value.param == "logit_bias" and "outside the vocabulary" in info.value.message


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


def test_a_logit_bias_dict_becomes_sorted_pairs() -> None:
    params = SamplingParams(logit_bias={9: 1.5, 2: -100})
    assert params.logit_bias == ((2, -100), (9, 1.5))
    assert params == SamplingParams(logit_bias=[[2, -100], [9, 1.5]])  # as msgpack/JSON carry it
    assert hash(params) == hash(SamplingParams(logit_bias=((2, -100), (9, 1.5))))
