"""From sampled token ids to finish decisions and `RequestOutput`s.

Per sequence it keeps the incremental detokenizer, the stop-string matcher
and how much of the output was already sent. Stop conditions are checked in
vLLM's order: nothing stops before `min_tokens`; then a stop token id or EOS,
then a stop string (the text is cut where it starts, or after it with
`include_stop_str_in_output`), then `max_tokens` and the context limit.
While a sequence runs, text that could still grow into a stop string is held
back, so what was streamed is always a prefix of the final text.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from hydrant.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from hydrant.engine.outputs import CompletionOutput, FinishReason, RequestMetrics, RequestOutput
from hydrant.engine.sampler import TokenLogprob
from hydrant.engine.sequence import Request, Sequence
from hydrant.engine.tokenizer import Tokenizer


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
        self, tokenizer: Tokenizer | None, eos_token_ids: frozenset[int], max_model_len: int
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self._states: dict[int, SequenceOutputState] = {}

    def state(self, seq: Sequence) -> SequenceOutputState:
        state = self._states.get(seq.seq_id)
        if state is None:
            state = self._states[seq.seq_id] = SequenceOutputState(seq, self.tokenizer)
        return state

    def drop(self, request: Request) -> None:
        for seq in request.seqs:
            self._states.pop(seq.seq_id, None)

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
