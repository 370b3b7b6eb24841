"""Structured output: tokens constrained to a JSON schema, a regex, a choice or a grammar.

OpenAI's `response_format` (`json_object`, `json_schema`) promises text that
parses, and with a schema, text that the schema accepts; vLLM's
`structured_outputs` adds a regular expression, a list of choices and a
Lark/GBNF grammar. Asking nicely in the prompt does not keep such a promise;
masking the logits does. A request's constraint is a `(kind, spec)` pair
(`KINDS`); each constrained sequence holds an `llguidance.LLMatcher`, a parser
of the grammar compiled from it that knows, after the tokens so far, which
vocabulary entries can come next. The sampler sets every other logit to -inf
before drawing (`apply_masks`); the engine feeds each drawn token back
(`Guide.accept`). When the grammar is complete, only EOS is allowed, so the
sequence ends with finish_reason "stop".

llguidance is the library vLLM offers as its `guidance` backend: a Rust
Earley parser whose mask costs tens of microseconds a token on a 128k
vocabulary, with no per-grammar precomputation, so a new schema costs nothing
up front. JSON is generated without free whitespace between tokens (OpenAI's
own structured outputs are compact): a free whitespace rule lets a model loop
on newlines until max_tokens, a known failure of guided decoding.

What a constraint is, and whether it compiles, is engine/output_constraints.py
(no torch: the gateway imports it). `GuideFactory` needs the tokenizer and is
built once per engine, on the first constrained request (about a second for a
128k vocabulary), not at load, so cold starts do not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import llguidance
import torch

from hydrant.engine.output_constraints import grammar, raise_if_invalid, refuse

if TYPE_CHECKING:
    from hydrant.engine.tokenizer import Tokenizer


class Guide:
    """One sequence's parser state: which tokens may come next."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fork(self) -> Guide:
        """An independent copy (a sibling choice of an `n > 1` request)."""
        return Guide(self._matcher.deep_copy())

    def fill_mask(self, row: torch.Tensor) -> None:
        """Write the allowed-token bitmask (int32 words, bit i of word w = token 32w+i)."""
        self._matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

    def accept(self, token_id: int) -> bool:
        """Advance past a drawn token; False if the grammar could not take it."""
        return bool(self._matcher.consume_token(token_id))


class GuideFactory:
    """Builds guides for one engine: the tokenizer's view of the vocabulary, made once."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self.vocab_size = vocab_size
        self._tokenizer = llguidance.LLTokenizer(
            tokenizer.backend_json(), n_vocab=vocab_size, eos_token=sorted(eos_token_ids)
        )

    def guide(self, kind: str, spec: str) -> Guide:
        raise_if_invalid(kind, spec)  # cached: the async front checked it off the loop
        try:
            matcher = llguidance.LLMatcher(self._tokenizer, grammar(kind, spec), log_level=0)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # documented never to raise; a panic would
            problem = f"the {kind} cannot constrain generation ({type(exc).__name__})"
        else:
            if not matcher.is_error():
                return Guide(matcher)
            problem = f"the {kind} cannot constrain generation: {matcher.get_error()}"
        refuse(kind, problem)


def apply_masks(logits: torch.Tensor, guides: Sequence[Guide | None]) -> None:
    """Set each guided row's disallowed logits to -inf, in place (one unpack for the batch)."""
    rows = [i for i, g in enumerate(guides) if g is not None]
    if not rows:
        return
    vocab = logits.shape[1]
    words = (vocab + 31) // 32
    bitmask = torch.empty((len(rows), words), dtype=torch.int32)
    for j, i in enumerate(rows):
        guide = guides[i]
        assert guide is not None
        guide.fill_mask(bitmask[j])
    bits = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = (bitmask.to(logits.device).unsqueeze(-1) >> bits) & 1
    index = torch.tensor(rows, device=logits.device)
    sub = logits[index]
    sub.masked_fill_(allowed.view(len(rows), words * 32)[:, :vocab] == 0, float("-inf"))
    logits[index] = sub
