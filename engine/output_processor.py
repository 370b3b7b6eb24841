"""From what a step computed to finish decisions and `RequestOutput`s.

`process` takes one step's results: prompt scores, finished prompts'
embeddings (an embedding request ends with its prompt) and the token each
sampled sequence drew, which its structured-output guide (when it has one)
must accept before the stop rules see it. It decides which sequences finished
and why; the engine has the scheduler free them, then asks for the outputs.

Per sequence it keeps the incremental detokenizer, the stop-string matcher
and how much of the output was already sent. Stop conditions are checked in
vLLM's order: nothing stops before `min_tokens`; then a stop token id or EOS,
then a stop string (the text is cut where it starts, or after it with
`include_stop_str_in_output`), then `max_tokens` and the context limit.
While a sequence runs, text that could still grow into a stop string is held
back, so what was streamed is always a prefix of the final text.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

from hydrant.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from hydrant.engine.errors import EngineError
from hydrant.engine.outputs import CompletionOutput, FinishReason, RequestMetrics, RequestOutput
from hydrant.engine.sampler import TokenLogprob
from hydrant.engine.sequence import Request, Sequence
from hydrant.engine.structured_output import GuideFactory
from hydrant.engine.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepSample:
    """One step's results: each sampled sequence (forked choices included) with the
    token it drew, finished prompts' embeddings, and the prompt tokens it scored."""

    seqs: list[Sequence] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob | None] = field(default_factory=list)
    embeddings: list[tuple[Sequence, list[float]]] = field(default_factory=list)
    prompt_logprobs: list[tuple[Sequence, int, list[TokenLogprob]]] = field(default_factory=list)


@dataclass(frozen=True)
class StepDecisions:
    """The requests a step touched (in the order they were touched), and which of their
    sequences finished, and why."""

    requests: list[Request]
    finished: list[tuple[Sequence, FinishReason]]


class SequenceOutputState:
    """Text and delivery state of one sequence's output."""

    def __init__(self, seq: Sequence, tokenizer: Tokenizer | None) -> None:
        params = seq.request.params
        self.detokenizer = (
            IncrementalDetokenizer(tokenizer, seq.prompt_token_ids) if tokenizer else None
        )
        self.matcher = (
            StopStringMatcher(params.stop, include_stop_str=params.include_stop_str_in_output)
            if params.stop
            else None
        )
        self.text = ""
        self.sent_chars = 0
        self.sent_tokens = 0
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        vocab_size: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self._states: dict[int, SequenceOutputState] = {}
        self._guides: GuideFactory | None = None  # built on the first structured request

    def attach_guide(self, seq: Sequence) -> None:
        """Give a request's first sequence its structured-output guide, if it asks for one
        (forked choices copy their parent's). Raises InvalidRequestError for a constraint
        that does not compile (cached: the async front compiled it off its loop)."""
        params = seq.request.params
        if params.structured_output is not None:
            seq.guide = self._guide_factory().guide(*params.structured_output)
            seq.guide_waits_for = params.structured_output_after

    def _guide_factory(self) -> GuideFactory:
        if self._guides is None:
            if self.tokenizer is None:  # validation refuses a constraint without one
                raise EngineError("structured output needs a tokenizer")
            started = time.perf_counter()
            self._guides = GuideFactory(self.tokenizer, self.vocab_size, self.eos_token_ids)
            logger.info(
                "structured output ready in %.3fs",
                time.perf_counter() - started,
                extra={"event": "guides_ready"},
            )
        return self._guides

    def state(self, seq: Sequence) -> SequenceOutputState:
        state = self._states.get(seq.seq_id)
        if state is None:
            state = self._states[seq.seq_id] = SequenceOutputState(seq, self.tokenizer)
        return state

    def drop(self, request: Request) -> None:
        for seq in request.seqs:
            self._states.pop(seq.seq_id, None)

    def process(self, sample: StepSample, now: float) -> StepDecisions:
        """Record what the step computed; say which sequences it finished."""
        touched: dict[str, Request] = {}
        finished: list[tuple[Sequence, FinishReason]] = []
        for seq, first, entries in sample.prompt_logprobs:
            seq.request.record_prompt_logprobs(first, entries)
        for seq, vector in sample.embeddings:
            request = seq.request
            request.embedding = vector
            request.times.first_token_time = now
            finished.append((seq, "stop"))
            touched[request.request_id] = request
        for seq, token, logprob in zip(sample.seqs, sample.token_ids, sample.logprobs, strict=True):
            request = seq.request
            if request.times.first_token_time is None:
                request.times.first_token_time = now
            reason = self._take_token(seq, token, logprob)
            if reason is not None:
                finished.append((seq, reason))
            touched[request.request_id] = request
        return StepDecisions(list(touched.values()), finished)

    def _take_token(
        self, seq: Sequence, token: int, logprob: TokenLogprob | None
    ) -> FinishReason | None:
        if seq.request.params.max_tokens == 0:  # scoring only: the prompt's logprobs were it
            return "length"
        guide = seq.active_guide
        if guide is not None and not guide.accept(token):
            # The mask allowed it, so the parser must take it: a bug, not the client's.
            # (The parser's message would quote the output: not logged.)
            logger.error(
                "a structured-output parser refused a token its own mask allowed",
                extra={"event": "guide_error", "request_id": seq.request.request_id},
            )
            return "error"
        if token == seq.guide_waits_for:  # thinking ended: the form holds from here
            seq.guide_waits_for = None
        return self.append_token(seq, token, logprob)

    def append_token(
        self, seq: Sequence, token_id: int, logprob: TokenLogprob | None
    ) -> FinishReason | None:
        """Add a sampled token to `seq`; return why it finished, or None."""
        state = self.state(seq)
        params = seq.request.params
        seq.output_token_ids.append(token_id)
        if state.logprobs is not None and logprob is not None:
            state.logprobs.append(logprob)
        delta = state.detokenizer.add(token_id) if state.detokenizer else ""
        state.text += delta
        num_out = len(seq.output_token_ids)
        if num_out >= params.min_tokens:
            is_eos = not params.ignore_eos and token_id in self.eos_token_ids
            if token_id in params.stop_token_ids or is_eos:
                if delta and not params.include_stop_str_in_output:
                    state.text = state.text[: len(state.text) - len(delta)]
                return "stop"
            if state.matcher is not None and delta:
                cut = state.matcher.check(state.text, len(delta))
                if cut is not None:
                    state.text = state.text[:cut]
                    return "stop"
        if num_out >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            if state.detokenizer is not None:
                state.text += state.detokenizer.flush()
            return "length"
        return None

    def completion(self, seq: Sequence) -> CompletionOutput:
        """The choice as of now; marks what it returns as sent."""
        state = self.state(seq)
        finished = seq.finish_reason is not None
        visible = len(state.text)
        if not finished and state.matcher is not None:
            visible -= state.matcher.holdback_len(state.text)
        new_text = state.text[state.sent_chars : visible] if visible > state.sent_chars else ""
        state.sent_chars = max(state.sent_chars, visible)
        tokens = seq.output_token_ids
        new_tokens = tokens[state.sent_tokens :]
        state.sent_tokens = len(tokens)
        return CompletionOutput(
            index=seq.index,
            token_ids=list(tokens),
            new_token_ids=new_tokens,
            text=state.text[: state.sent_chars],
            new_text=new_text,
            finish_reason=seq.finish_reason,
            logprobs=list(state.logprobs) if state.logprobs is not None else None,
        )

    def request_output(self, request: Request) -> RequestOutput:
        seqs: Seq[Sequence] = sorted(request.seqs, key=lambda s: s.index)
        times = request.times
        metrics = RequestMetrics(
            prompt_tokens=len(request.prompt_token_ids),
            cached_tokens=times.cached_tokens,
            completion_tokens=request.completion_tokens(),
            arrival_time=times.arrival_time,
            first_scheduled_time=times.first_scheduled_time,
            first_token_time=times.first_token_time,
            finish_time=times.finish_time,
            device_seconds=times.device_seconds,
            num_preemptions=request.num_preemptions,
        )
        prompt_logprobs = None
        if request.prompt_logprobs is not None and not request.prompt_logprobs_sent:
            request.prompt_logprobs_sent = True
            prompt_logprobs = list(request.prompt_logprobs)
        return RequestOutput(
            request_id=request.request_id,
            outputs=[self.completion(seq) for seq in seqs],
            finished=request.finished,
            metrics=metrics,
            prompt_logprobs=prompt_logprobs,
            embedding=request.embedding,
        )
