"""The pure parts of upstream pools: the completions body, reading the stream back, the
device-time estimate, the health probe's readings. Against a real `vllm serve`:
tests/e2e/test_upstream_vllm.py."""

from __future__ import annotations

import random

import pytest

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.protocol import AdapterRef, GenerateRequest, Sampling
from hydrant.platform.dispatch.upstream_cost import MemberCost
from hydrant.platform.dispatch.upstream_health import member_id, served_entry, stats_of
from hydrant.platform.dispatch.upstream_wire import (
    SseLines,
    chunk_of,
    completion_body,
    error_message,
    event_decoder,
)


def request(**sampling: object) -> GenerateRequest:
    return GenerateRequest(
        request_id="r1",
        prompt_token_ids=[1, 5, 6],
        sampling=Sampling(**sampling),  # type: ignore[arg-type]
    )


def test_the_body_sends_token_ids_streamed_with_usage_and_every_sampling_setting() -> None:
    body = completion_body(
        request(
            max_tokens=7,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            min_p=0.1,
            repetition_penalty=1.1,
            presence_penalty=0.2,
            frequency_penalty=0.3,
            seed=11,
            stop=("END",),
            stop_token_ids=(2,),
            ignore_eos=True,
            logprobs=2,
            logit_bias=((5, -1.0),),
            n=2,
        ),
        "m",
    )
    assert body["model"] == "m" and body["prompt"] == [1, 5, 6]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True and body["add_special_tokens"] is False
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["top_k"]) == (
        7,
        0.5,
        0.9,
        40,
    )
    assert (body["min_p"], body["repetition_penalty"]) == (0.1, 1.1)
    assert (body["presence_penalty"], body["frequency_penalty"], body["seed"]) == (0.2, 0.3, 11)
    assert body["stop"] == ["END"] and body["stop_token_ids"] == [2] and body["ignore_eos"]
    assert body["logprobs"] == 2 and body["return_tokens_as_token_ids"] is True
    assert body["logit_bias"] == {"5": -1.0} and body["n"] == 2
    plain = completion_body(request(), "m")
    assert plain["top_k"] == -1  # off
    assert "seed" not in plain and "stop" not in plain and "logprobs" not in plain


def test_constraints_map_to_structured_outputs() -> None:
    schema = completion_body(request(structured_output=("json", '{"type":"object"}')), "m")
    assert schema["structured_outputs"] == {"json": {"type": "object"}}
    choice = completion_body(request(structured_output=("choice", '["a","b"]')), "m")
    assert choice["structured_outputs"] == {"choice": ["a", "b"]}
    regex = completion_body(request(structured_output=("regex", "[0-9]+")), "m")
    assert regex["structured_outputs"] == {"regex": "[0-9]+"}


@pytest.mark.parametrize(
    ("changed", "param"),
    [
        ({"embed": True}, "input"),
        ({"prompt_logprobs": 1}, "prompt_logprobs"),
        ({"structured_output": ("json", "{}"), "structured_output_after": 5}, "response_format"),
    ],
)
def test_what_an_upstream_cannot_run_is_a_clear_400(changed: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        completion_body(request(**changed), "m")
    assert caught.value.param == param
    with_adapter = GenerateRequest(
        request_id="r",
        prompt_token_ids=[1],
        sampling=Sampling(),
        adapter=AdapterRef(name="a", path="/a"),
    )
    with pytest.raises(InvalidRequestError):
        completion_body(with_adapter, "m")


def test_events_read_back_as_chunks_with_ids_logprobs_and_finish() -> None:
    event = event_decoder.decode(
        b'{"choices":[{"index":0,"text":"od","token_ids":[477],"finish_reason":null,'
        b'"logprobs":{"tokens":["token_id:477"],"token_logprobs":[-6.9],'
        b'"top_logprobs":[{"token_id:477":-6.9,"token_id:3":-7.5}]}},'
        b'{"index":1,"text":"","token_ids":[],"finish_reason":"length"}]}'
    )
    chunk = chunk_of("r1", event)
    assert chunk is not None and chunk.request_id == "r1" and not chunk.finished
    first, second = chunk.choices
    assert (first.index, first.text, first.token_ids, first.finish_reason) == (0, "od", [477], None)
    assert first.logprobs is not None
    assert first.logprobs[0].token_id == 477 and first.logprobs[0].logprob == -6.9
    assert first.logprobs[0].top == [(477, -6.9), (3, -7.5)]
    assert (second.index, second.finish_reason) == (1, "length")
    # the first event of a vLLM stream may carry only the prompt's ids: nothing to send
    empty = event_decoder.decode(b'{"choices":[{"index":0,"text":"","prompt_token_ids":[1]}]}')
    assert chunk_of("r1", empty) is None
    usage = event_decoder.decode(
        b'{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2,'
        b'"prompt_tokens_details":{"cached_tokens":3}}}'
    )
    assert chunk_of("r1", usage) is None
    assert usage.usage is not None and usage.usage.prompt_tokens_details is not None
    assert usage.usage.prompt_tokens_details.cached_tokens == 3


def test_sse_payloads_are_split_whatever_the_pieces() -> None:
    lines = SseLines()
    assert lines.feed(b'data: {"a"') == []
    assert lines.feed(b':1}\n\n: comment\ndata: {"b":2}\r\n\ndata: [DO') == [
        b'{"a":1}',
        b'{"b":2}',
    ]
    assert lines.feed(b"NE]\n\n") == [None]


def test_error_answers_of_any_shape_give_their_message() -> None:
    assert error_message(b'{"error":{"message":"too long","param":"max_tokens"}}') == (
        "too long",
        "max_tokens",
    )
    assert error_message(b'{"message":"nope"}') == ("nope", None)
    assert error_message(b"Internal Server Error") == ("Internal Server Error", None)


def test_device_time_is_split_by_each_requests_tokens_while_they_overlap() -> None:
    now = [0.0]
    cost = MemberCost(clock=lambda: now[0])
    cost.start("a", 100)
    now[0] = 1.0  # a alone for 1 s
    cost.start("b", 300)
    now[0] = 2.0  # 1 s shared 100:300
    cost.grow("a", 200)
    now[0] = 3.0  # 1 s shared 300:300
    assert cost.finish("a") == pytest.approx(1.0 + 0.25 + 0.5)
    now[0] = 4.0  # b alone for 1 s
    assert cost.finish("b") == pytest.approx(0.75 + 0.5 + 1.0)
    assert cost.finish("b") == 0.0  # once


class _NaiveCost:
    """The apportioning written the obvious way (every request advanced at every event)."""

    def __init__(self) -> None:
        self.active: dict[str, list[float]] = {}  # id -> [tokens, seconds]
        self.last = 0.0

    def advance(self, now: float) -> None:
        total = sum(t for t, _ in self.active.values())
        if total:
            for share in self.active.values():
                share[1] += (now - self.last) * share[0] / total
        self.last = now


def test_device_time_matches_the_per_request_split_on_random_timelines() -> None:
    rng = random.Random(7)
    for _ in range(50):
        now = [0.0]
        cost = MemberCost(clock=lambda now=now: now[0])
        naive = _NaiveCost()
        busy = 0.0
        got: dict[str, float] = {}
        want: dict[str, float] = {}
        for step in range(200):
            dt = rng.choice([0.0, rng.random()])
            if naive.active:
                busy += dt
            now[0] += dt
            naive.advance(now[0])
            action = rng.random()
            if action < 0.3 or not naive.active:
                rid = f"r{step}"
                tokens = rng.randint(1, 500)
                cost.start(rid, tokens)
                naive.active[rid] = [tokens, 0.0]
            elif action < 0.8:
                rid = rng.choice(sorted(naive.active))
                n = rng.randint(0, 8)
                cost.grow(rid, n)
                naive.active[rid][0] += n
            else:
                rid = rng.choice(sorted(naive.active))
                got[rid] = cost.finish(rid)
                want[rid] = naive.active.pop(rid)[1]
        for rid in list(naive.active):
            got[rid] = cost.finish(rid)
            want[rid] = naive.active.pop(rid)[1]
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
        assert sum(got.values()) == pytest.approx(busy, rel=1e-9, abs=1e-9)  # nothing lost


def test_the_probe_reads_vllms_load_and_its_model_list() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="0",model_name="other"} 9.0\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    )
    stats = stats_of(text, "m")
    assert stats is not None
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (3, 1, 0.25)
    assert stats_of("# nothing of vLLM's\n", "m") is None
    body = {"data": [{"id": "x"}, {"id": "m", "root": "/w", "max_model_len": 2048}]}
    assert served_entry(body, "m") == {"id": "m", "root": "/w", "max_model_len": 2048}
    assert served_entry(body, "n") is None and served_entry({"oops": 1}, "m") is None
    assert member_id("openai", "http://h:8000") == member_id("openai", "http://h:8000")
    assert member_id("openai", "http://h:8000") != member_id("openai", "http://h2:8000")


async def test_billing_uses_the_gateways_counts_and_counts_a_mismatch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from hydrant.platform.dispatch.metrics import PoolMetrics
    from hydrant.platform.dispatch.upstream_http import UpstreamHttp
    from hydrant.platform.dispatch.upstream_wire import PromptTokensDetails, UpstreamUsage

    metrics = PoolMetrics()
    http = UpstreamHttp("m", "sk-secret-upstream", metrics)
    try:
        agreed = UpstreamUsage(
            prompt_tokens=3,
            completion_tokens=5,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=2),
        )
        usage = http._billed(request(), agreed, {0: 5}, 0.25, 1.0)
        assert (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (3, 2, 5)
        assert usage.device_ns == 250_000_000
        claimed = UpstreamUsage(prompt_tokens=3, completion_tokens=9)  # the upstream says 9
        with caplog.at_level("WARNING"):
            usage = http._billed(request(), claimed, {0: 4, 1: 1}, 0.0, 1.0)
        assert usage.completion_tokens == 5  # billed: the token ids the gateway received
        sample = metrics.registry.get_sample_value(
            "hydrant_upstream_usage_mismatches_total", {"model": "m", "field": "completion_tokens"}
        )
        assert sample == 1.0
        assert "sk-secret-upstream" not in caplog.text
        # no token ids in the stream (a server without `return_token_ids`): its count stands
        assert http._billed(request(), claimed, {}, 0.0, 1.0).completion_tokens == 9
    finally:
        await http.aclose()
