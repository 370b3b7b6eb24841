"""Structured output: JSON-schema masks through the whole engine, checked against transformers.

The reference is the definition itself: with a schema, greedy decoding must
choose, at every step, the most likely token (transformers' logits for the
same prefix) among those the schema allows next (an independent llguidance
parser fed the same tokens). Outputs must parse and validate with
`jsonschema`, alone, batched with unconstrained requests, forked into `n`
choices and under preemption.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import EngineTracker, build_tiny_model, load_hf_model, run_to_completion

from hydrant.engine.async_engine import running
from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.output_constraints import MAX_SPEC_BYTES, canonical_schema, constraint_error
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request
from hydrant.engine.structured_output import Guide, GuideFactory, apply_masks
from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Every field bounded, so even a random model finishes the object well within max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["yes", "no", "maybe"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["verdict", "score", "tags", "ok"],
    "additionalProperties": False,
}
SCHEMA_TEXT = canonical_schema(SCHEMA)
MAX_TOKENS = 120


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("guided"), "llama", seed=3)


@pytest.fixture(scope="module")
def guides(model_dir: Path) -> GuideFactory:
    tokenizer = Tokenizer.from_pretrained(model_dir)
    return GuideFactory(tokenizer, tokenizer.vocab_size, tokenizer.eos_token_ids)


def _prompt(engine: LLMEngine, text: str) -> list[int]:
    assert engine.tokenizer is not None
    return engine.tokenizer.encode(text)


def _greedy(**extra: object) -> SamplingParams:
    return SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.0, structured_output=("json", SCHEMA_TEXT), **extra
    )  # type: ignore[arg-type]


def _check(text: str) -> dict[str, object]:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"type": "nonsense"}', "nonsense"),
        ('{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}', "nowhere"),
        ('{"description": "' + "x" * MAX_SPEC_BYTES + '"}', "larger than"),
        # llguidance 1.9 panics on this one (cutting its message inside the "½"): the
        # meta-schema check answers first.
        ('{"maxItems": {"items": "' + "x" * 87 + '½½½"}}', "JSON Schema"),
    ],
)
def test_constraint_error_says_why_a_schema_cannot_be_used(
    text: str, fragment: str, guides: GuideFactory
) -> None:
    problem = constraint_error("json", text)
    assert problem is not None and fragment in problem
    SamplingParams(structured_output=("json", text)).validate()  # cheap checks only
    with pytest.raises(InvalidRequestError) as info:
        guides.guide("json", text)
    assert info.value.param == "response_format" and fragment in info.value.message


def test_valid_schemas_pass_and_conflicting_settings_are_refused() -> None:
    assert constraint_error("json", SCHEMA_TEXT) is None
    assert constraint_error("json", '{"type":"object"}') is None
    SamplingParams(structured_output=("json", SCHEMA_TEXT)).validate()
    for extra, param in (({"min_tokens": 3}, "min_tokens"), ({"ignore_eos": True}, "ignore_eos")):
        with pytest.raises(InvalidRequestError) as info:
            SamplingParams(structured_output=("json", SCHEMA_TEXT), **extra).validate()  # type: ignore[arg-type]
        assert info.value.param == param


_KEYWORDS = st.sampled_from(
    [
        "type",
        "properties",
        "items",
        "enum",
        "pattern",
        "required",
        "anyOf",
        "oneOf",
        "allOf",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "const",
        "additionalProperties",
        "minItems",
        "maxItems",
        "$ref",
        "$defs",
        "format",
        "prefixItems",
    ]
)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=6)
    | st.sampled_from(
        ["object", "array", "string", "integer", "number", "boolean", "null", "#/$defs/a"]
    )
)
_SCHEMAS = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYWORDS, inner, max_size=4),
    max_leaves=16,
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=_SCHEMAS)
def test_any_schema_is_refused_clearly_or_builds_a_guide(
    schema: object, guides: GuideFactory
) -> None:
    text = canonical_schema(schema)
    problem = constraint_error("json", text)  # never raises, whatever the schema
    if problem is None:
        row = torch.zeros(1, guides.vocab_size)
        apply_masks(row, [guides.guide("json", text)])
        assert torch.isfinite(row).any()  # a first token is always possible


class _FixedGuide(Guide):
    """A guide whose mask is given: apply_masks' unpacking, apart from any parser."""

    def __init__(self, allowed: set[int]) -> None:
        self.allowed = allowed

    def fill_mask(self, row: torch.Tensor) -> None:
        words = [0] * row.numel()
        for token in self.allowed:
            words[token // 32] |= 1 << (token % 32)
        row.copy_(torch.tensor(words, dtype=torch.int64).to(torch.int32))  # wraps bit 31


def test_apply_masks_leaves_exactly_the_allowed_tokens() -> None:
    vocab = 70  # not a multiple of 32: the last word is partly padding
    logits = torch.randn(3, vocab)
    before = logits.clone()
    allowed = [{0, 31, 32, 63, 69}, None, {5}]
    apply_masks(logits, [_FixedGuide(a) if a is not None else None for a in allowed])
    for row, tokens in enumerate(allowed):
        if tokens is None:
            assert torch.equal(logits[row], before[row])
            continue
        finite = set(torch.isfinite(logits[row]).nonzero().flatten().tolist())
        assert finite == tokens
        assert torch.equal(logits[row, sorted(tokens)], before[row, sorted(tokens)])


def test_greedy_output_is_the_best_allowed_token_at_every_step(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompt = _prompt(engine, "Rate the river in JSON:")
    engine.add_request(Request("g", prompt, _greedy()))
    output = run_to_completion(engine)["g"].outputs[0]
    assert output.finish_reason == "stop"
    _check(output.text)
    tokens = list(output.token_ids)
    assert engine.tokenizer is not None
    # An independent parser, and transformers' logits for every prefix in one forward.
    parser = GuideFactory(
        engine.tokenizer, engine.model_config.vocab_size, engine.tokenizer.eos_token_ids
    ).guide("json", SCHEMA_TEXT)
    with torch.inference_mode():
        hf_logits = load_hf_model(model_dir)(torch.tensor([prompt + tokens])).logits[0].float()
    eos = engine.tokenizer.eos_token_ids
    steps = [*tokens, *(t for t in [None] if len(tokens) < MAX_TOKENS)]  # then EOS, if it stopped
    for j, token in enumerate(steps):
        row = hf_logits[len(prompt) - 1 + j].clone().unsqueeze(0)
        apply_masks(row, [parser])
        best = row[0].max().item()
        if token is None:  # it stopped: EOS was the best allowed continuation
            assert max(row[0, t].item() for t in eos) == pytest.approx(best, abs=1e-3)
            break
        assert row[0, token].item() == pytest.approx(best, abs=1e-3), (j, token)
        assert parser.accept(token)
    # Unconstrained, the same model writes no JSON at all: the mask did the work.
    engine.add_request(Request("free", prompt, SamplingParams(max_tokens=20, temperature=0.0)))
    free = run_to_completion(engine)["free"].outputs[0].text
    with pytest.raises(ValueError):
        json.loads(free)


def test_outputs_validate_alone_batched_forked_and_preempted(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompts = [_prompt(engine, f"Case {i}: rate it in JSON.") for i in range(6)]
    alone = []
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"alone-{i}", prompt, _greedy()))
        alone.append(run_to_completion(engine)[f"alone-{i}"].outputs[0].text)
    for text in alone:
        _check(text)
    # Batched with free-text and sampled, forked requests: greedy answers do not move.
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(f"batch-{i}", prompt, _greedy()))
        engine.add_request(
            Request(f"free-{i}", prompt, SamplingParams(max_tokens=30, temperature=0.8))
        )
    sampled = SamplingParams(
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        top_p=0.95,
        n=4,
        seed=5,
        structured_output=("json", SCHEMA_TEXT),
    )
    engine.add_request(Request("sampled", prompts[0], sampled))
    finals = run_to_completion(engine)
    assert [finals[f"batch-{i}"].outputs[0].text for i in range(6)] == alone
    choices = [c.text for c in finals["sampled"].outputs]
    assert len(choices) == 4 and len(set(choices)) > 1  # each choice its own parser
    for text in choices:
        _check(text)
    # A KV cache so small that sequences are preempted and recomputed mid-object.
    tight = engines.make(model_dir, num_gpu_blocks=64, block_size=4)
    for i, prompt in enumerate(prompts):
        tight.add_request(Request(f"tight-{i}", prompt, _greedy()))
    squeezed = run_to_completion(tight)
    assert tight.scheduler.num_preemptions > 0
    assert [squeezed[f"tight-{i}"].outputs[0].text for i in range(6)] == alone


OTHER_KINDS: list[tuple[str, str, str]] = [
    # (kind, spec, a Python regex every output must fullmatch)
    ("choice", json.dumps(["positive", "negative", "naïve ✓"]), r"positive|negative|naïve ✓"),
    ("regex", r"[0-9]{3}-[a-z]{2,4}", r"[0-9]{3}-[a-z]{2,4}"),
    ("grammar", 'start: "<" NAME ">"\nNAME: /[a-z]{1,5}/', r"<[a-z]{1,5}>"),
]


@pytest.mark.parametrize(("kind", "spec", "pattern"), OTHER_KINDS)
def test_regex_choice_and_grammar_constrain_greedy_and_sampled_output(
    kind: str, spec: str, pattern: str, model_dir: Path, engines: EngineTracker
) -> None:
    assert constraint_error(kind, spec) is None
    engine = engines.make(model_dir)
    prompt = _prompt(engine, "Classify the river:")
    greedy = SamplingParams(max_tokens=40, temperature=0.0, structured_output=(kind, spec))
    sampled = SamplingParams(
        max_tokens=40, temperature=1.0, n=6, seed=2, structured_output=(kind, spec)
    )
    engine.add_request(Request("greedy", prompt, greedy))
    engine.add_request(Request("sampled", prompt, sampled))
    finals = run_to_completion(engine)
    outputs = [*finals["greedy"].outputs, *finals["sampled"].outputs]
    for output in outputs:
        assert output.finish_reason == "stop"
        assert re.fullmatch(pattern, output.text), (kind, output.text)


def test_a_constraint_can_wait_for_the_end_of_thinking(
    model_dir: Path, engines: EngineTracker
) -> None:
    """With `structured_output_after`, the output is free up to and including that token
    (a thinking model's `</think>`; here a token the free output writes), then held to the
    form; a token that never comes leaves the whole output free."""
    engine = engines.make(model_dir)
    assert engine.tokenizer is not None
    prompt = _prompt(engine, "Think, then answer:")
    engine.add_request(Request("free", prompt, SamplingParams(max_tokens=12, temperature=0.0)))
    free = run_to_completion(engine)["free"].outputs[0].token_ids
    at = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    marker = free[at]
    for request_id, n in (("one", 1), ("forked", 3)):
        engine.add_request(
            Request(request_id, prompt, _greedy(n=n, structured_output_after=marker))
        )
    finals = run_to_completion(engine)
    for output in [*finals["one"].outputs, *finals["forked"].outputs]:
        assert output.token_ids[: at + 1] == free[: at + 1]  # free until the marker
        assert output.finish_reason == "stop"
        _check(engine.tokenizer.decode(output.token_ids[at + 1 :]))
    absent = next(t for t in range(100, 2000) if t not in free)
    waiting = SamplingParams(
        max_tokens=12,
        temperature=0.0,
        structured_output=("json", SCHEMA_TEXT),
        structured_output_after=absent,
    )
    engine.add_request(Request("never", prompt, waiting))
    assert run_to_completion(engine)["never"].outputs[0].token_ids == free
    for bad in (-1, 10**6):
        with pytest.raises(InvalidRequestError) as refused:
            _greedy(structured_output_after=bad).validate(vocab_size=2048)
        assert refused.value.param == "structured_outputs"
    with pytest.raises(InvalidRequestError, match="needs structured_output"):
        SamplingParams(structured_output_after=5).validate()


@pytest.mark.parametrize(
    ("kind", "spec", "fragment"),
    [
        ("regex", "(unclosed", "unclosed group"),
        ("regex", "", "empty"),
        ("choice", "[]", "non-empty strings"),
        ("choice", '["a", ""]', "non-empty strings"),
        ("choice", '"a"', "non-empty strings"),
        ("grammar", "start: missing_rule", "missing_rule"),
        ("xml", "<a/>", "kind must be one of"),
    ],
)
def test_bad_regexes_choices_and_grammars_are_refused(
    kind: str, spec: str, fragment: str, guides: GuideFactory
) -> None:
    problem = constraint_error(kind, spec)
    assert problem is not None and fragment in problem
    if kind != "xml":
        with pytest.raises(InvalidRequestError) as info:
            guides.guide(kind, spec)
        assert info.value.param == "structured_outputs"


async def test_the_async_front_refuses_a_bad_schema_and_serves_a_good_one(
    model_dir: Path, engines: EngineTracker
) -> None:
    engine = engines.make(model_dir)
    prompt = _prompt(engine, "Rate it in JSON:")
    async with running(engine) as front:
        bad = SamplingParams(max_tokens=20, structured_output=("json", '{"type": "nonsense"}'))
        with pytest.raises(InvalidRequestError) as info:
            [o async for o in front.generate(Request("bad", prompt, bad))]
        assert info.value.param == "response_format"
        outputs = [o async for o in front.generate(Request("good", prompt, _greedy()))]
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "stop"
    _check(outputs[-1].outputs[0].text)


def test_a_schema_needs_a_tokenizer(
    model_dir: Path, engines: EngineTracker, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare)
    (bare / "tokenizer.json").unlink()
    engine = engines.make(bare)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request(Request("x", [5, 6, 7], _greedy()))
    assert info.value.param == "response_format"
