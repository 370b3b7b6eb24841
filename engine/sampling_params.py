"""How one request wants its tokens chosen, and the checks that keep it servable.

The fields mirror the OpenAI request parameters (and vLLM's extensions:
top_k, min_p, repetition_penalty, min_tokens, ignore_eos), so the API layer
copies them across one to one and an `InvalidRequestError.param` can name the
field the client sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.output_constraints import KINDS, request_field

# Below this a temperature is treated as 0: dividing logits by ~0 overflows,
# and a client asking for 1e-9 means "deterministic".
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_LOGPROBS = 20
# OpenAI's documented range for presence/frequency penalties.
MAX_ABS_OPENAI_PENALTY = 2.0
# OpenAI's documented range for a logit bias; +-100 bans or forces a token outright.
MAX_ABS_LOGIT_BIAS = 100.0
# Ours: each biased token is one more element written into the logits at every step.
MAX_LOGIT_BIAS_TOKENS = 1024
_SEED_MIN = -(2**63)
_SEED_MAX = 2**64 - 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings; immutable so sequences of one request can share it.

    `top_k = 0` turns top-k off; `logprobs = None` asks for none, `k >= 0` asks
    for the chosen token's logprob plus k alternatives. `prompt_logprobs = k`
    asks the same for every prompt token after the first (the model's raw
    distribution given the tokens before it: OpenAI's `echo` with `logprobs`,
    which evaluation harnesses use to score text); such a prompt is always
    computed, never taken from the prefix cache, and `max_tokens = 0` then
    asks for the scores alone. `logit_bias` holds (token id, bias) pairs added
    to the model's logits before anything else (OpenAI's parameter; a dict is
    accepted and kept sorted). `structured_output` is a `(kind, spec)` pair
    (engine/structured_output.py: a JSON schema, a regex, a choice or a
    grammar) the output must match: OpenAI's `response_format`, vLLM's
    `structured_outputs`. With `structured_output_after`, a token id (a thinking
    model's `</think>`), the output is free until it first writes that token and held
    to the form after it, as vLLM does with a reasoning parser. `embed` asks for no
    text at all but the prompt's embedding: the final hidden state of its last token,
    L2-normalized (last-token pooling, as decoder embedding models such as
    Qwen3-Embedding are trained), with
    `max_tokens = 0`; `embed_dimensions` keeps its first k values (Matryoshka models
    only), normalized again. `stop` / `stop_token_ids` / `logit_bias`
    given as lists (or `stop` as one string, as OpenAI allows) are turned into
    tuples so the object stays hashable.
    """

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured_output: tuple[str, str] | None = None
    structured_output_after: int | None = None
    embed: bool = False
    embed_dimensions: int | None = None

    def __post_init__(self) -> None:
        stop: Any = self.stop
        if isinstance(stop, str):
            object.__setattr__(self, "stop", (stop,))
        elif isinstance(stop, list):
            object.__setattr__(self, "stop", tuple(stop))
        stop_ids: Any = self.stop_token_ids
        if isinstance(stop_ids, list):
            object.__setattr__(self, "stop_token_ids", tuple(stop_ids))
        structured: Any = self.structured_output
        if isinstance(structured, list):
            object.__setattr__(self, "structured_output", tuple(structured))
        bias: Any = self.logit_bias
        if isinstance(bias, dict):
            bias = list(bias.items())
            if all(_is_int(token) for token, _ in bias):
                bias.sort()
        if isinstance(bias, list):
            pairs = (tuple(p) if isinstance(p, list | tuple) else p for p in bias)
            object.__setattr__(self, "logit_bias", tuple(pairs))

    @property
    def is_greedy(self) -> bool:
        """Whether the next token is simply the argmax (temperature 0)."""
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def max_stop_len(self) -> int:
        """Length of the longest stop string (0 when there are none)."""
        return max((len(s) for s in self.stop), default=0)

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise `InvalidRequestError` naming the first parameter that cannot be served.

        `vocab_size`, when known, also bounds `stop_token_ids` and `top_k`: an
        out-of-range id would index past the logits row on the device, which
        is a crash there rather than a clear error here.
        """
        self._validate_embedding()
        self._validate_counts()
        self._validate_distribution(vocab_size)
        self._validate_penalties()
        self._validate_stops(vocab_size)
        self._validate_logit_bias(vocab_size)
        self._validate_structured_output(vocab_size)
        self._validate_misc()

    def _validate_counts(self) -> None:
        if not _is_int(self.n) or self.n < 1:
            raise InvalidRequestError(f"n must be an integer >= 1, got {self.n!r}", "n")
        # 0 only scores the prompt (OpenAI's echo with logprobs and max_tokens 0)
        least = 0 if self.prompt_logprobs is not None or self.embed is True else 1
        if not _is_int(self.max_tokens) or self.max_tokens < least:
            raise InvalidRequestError(
                f"max_tokens must be an integer >= {least}, got {self.max_tokens!r}"
                + ("" if least == 0 else " (0 only with prompt_logprobs or embed)"),
                "max_tokens",
            )
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            raise InvalidRequestError(
                f"min_tokens must be an integer >= 0, got {self.min_tokens!r}", "min_tokens"
            )
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
                "min_tokens",
            )

    def _validate_distribution(self, vocab_size: int | None) -> None:
        t = self.temperature
        if not _is_number(t) or not math.isfinite(t) or t < 0:
            raise InvalidRequestError(
                f"temperature must be a finite number >= 0, got {t!r}", "temperature"
            )
        p = self.top_p
        if not _is_number(p) or not math.isfinite(p) or not 0.0 < p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {p!r}", "top_p")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise InvalidRequestError(
                f"top_k must be an integer >= 0 (0 disables it), got {self.top_k!r}", "top_k"
            )
        if vocab_size is not None and self.top_k > vocab_size:
            raise InvalidRequestError(
                f"top_k ({self.top_k}) exceeds the vocabulary size ({vocab_size})", "top_k"
            )
        m = self.min_p
        if not _is_number(m) or not math.isfinite(m) or not 0.0 <= m <= 1.0:
            raise InvalidRequestError(f"min_p must be in [0, 1], got {m!r}", "min_p")

    def _validate_penalties(self) -> None:
        r = self.repetition_penalty
        if not _is_number(r) or not math.isfinite(r) or r <= 0:
            raise InvalidRequestError(
                f"repetition_penalty must be a finite number > 0, got {r!r}",
                "repetition_penalty",
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if (
                not _is_number(value)
                or not math.isfinite(value)
                or abs(value) > MAX_ABS_OPENAI_PENALTY
            ):
                raise InvalidRequestError(
                    f"{name} must be in [-{MAX_ABS_OPENAI_PENALTY}, {MAX_ABS_OPENAI_PENALTY}], "
                    f"got {value!r}",
                    name,
                )

    def _validate_stops(self, vocab_size: int | None) -> None:
        if not isinstance(self.stop, tuple) or not all(isinstance(s, str) for s in self.stop):
            raise InvalidRequestError("stop must be a string or a list of strings", "stop")
        if any(s == "" for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", "stop")
        ids = self.stop_token_ids
        if not isinstance(ids, tuple) or not all(_is_int(i) and i >= 0 for i in ids):
            raise InvalidRequestError(
                "stop_token_ids must be a list of non-negative integers", "stop_token_ids"
            )
        if vocab_size is not None:
            bad = [i for i in ids if i >= vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"stop_token_ids {bad} are outside the vocabulary (size {vocab_size})",
                    "stop_token_ids",
                )

    def _validate_logit_bias(self, vocab_size: int | None) -> None:
        pairs = self.logit_bias
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 for p in pairs
        ):
            raise InvalidRequestError("logit_bias must map token ids to numbers", "logit_bias")
        if len(pairs) > MAX_LOGIT_BIAS_TOKENS:
            raise InvalidRequestError(
                f"logit_bias takes at most {MAX_LOGIT_BIAS_TOKENS} tokens, got {len(pairs)}",
                "logit_bias",
            )
        seen: set[int] = set()
        for token, bias in pairs:
            if not _is_int(token) or token < 0:
                raise InvalidRequestError(
                    f"logit_bias keys must be token ids (integers >= 0), got {token!r}",
                    "logit_bias",
                )
            if vocab_size is not None and token >= vocab_size:
                raise InvalidRequestError(
                    f"logit_bias token {token} is outside the vocabulary (size {vocab_size})",
                    "logit_bias",
                )
            if token in seen:
                raise InvalidRequestError(f"logit_bias names token {token} twice", "logit_bias")
            seen.add(token)
            if not _is_number(bias) or not -MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS:
                raise InvalidRequestError(
                    f"logit_bias values must be in [-{MAX_ABS_LOGIT_BIAS:g}, "
                    f"{MAX_ABS_LOGIT_BIAS:g}], got {bias!r} for token {token}",
                    "logit_bias",
                )

    def _validate_structured_output(self, vocab_size: int | None) -> None:
        constraint: Any = self.structured_output
        if constraint is None:
            if self.structured_output_after is not None:
                raise InvalidRequestError(
                    "structured_output_after needs structured_output", "structured_outputs"
                )
            return
        # Whether the spec compiles is not checked here: that can take a fraction of a
        # second, and this runs on event loops (structured_output.constraint_error, off them).
        if not (
            isinstance(constraint, tuple)
            and len(constraint) == 2
            and constraint[0] in KINDS
            and isinstance(constraint[1], str)
        ):
            raise InvalidRequestError(
                f"structured_output must be (kind, spec) with kind one of {', '.join(KINDS)}",
                "structured_outputs",
            )
        field = request_field(constraint[0])
        after = self.structured_output_after
        if after is not None and (
            not _is_int(after) or after < 0 or (vocab_size is not None and after >= vocab_size)
        ):
            raise InvalidRequestError(
                f"structured_output_after must be a token id of the vocabulary, got {after!r}",
                "structured_outputs",
            )
        # The grammar allows EOS exactly when the output is complete: these would fight it.
        if self.min_tokens:
            raise InvalidRequestError(f"min_tokens cannot be combined with {field}", "min_tokens")
        if self.ignore_eos:
            raise InvalidRequestError(f"ignore_eos cannot be combined with {field}", "ignore_eos")

    def _validate_embedding(self) -> None:
        if not isinstance(self.embed, bool):
            raise InvalidRequestError("embed must be a boolean", "embed")
        dims = self.embed_dimensions
        if not self.embed:
            if dims is not None:
                raise InvalidRequestError("embed_dimensions needs embed", "dimensions")
            return
        if dims is not None and (not _is_int(dims) or dims < 1):
            raise InvalidRequestError(
                f"dimensions must be an integer >= 1, got {dims!r}", "dimensions"
            )
        # An embedding is the prompt's alone: nothing is generated, sampled or scored.
        if self.max_tokens != 0:
            raise InvalidRequestError("an embedding request has max_tokens 0", "max_tokens")
        for name, unset in (
            ("n", self.n == 1),
            ("logprobs", self.logprobs is None),
            ("prompt_logprobs", self.prompt_logprobs is None),
            ("structured_outputs", self.structured_output is None),
        ):
            if not unset:
                raise InvalidRequestError(f"{name} cannot be combined with embed", name)

    def _validate_misc(self) -> None:
        if self.seed is not None and (
            not _is_int(self.seed) or not _SEED_MIN <= self.seed <= _SEED_MAX
        ):
            raise InvalidRequestError(
                f"seed must be an integer in [{_SEED_MIN}, {_SEED_MAX}], got {self.seed!r}",
                "seed",
            )
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_LOGPROBS):
                raise InvalidRequestError(
                    f"{name} must be an integer in [0, {MAX_LOGPROBS}], got {lp!r}", name
                )
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(f"{name} must be a boolean", name)
