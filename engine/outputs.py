"""What `LLMEngine.step()` returns: typed, per request, incremental and cumulative.

Each `CompletionOutput` carries both the whole output so far (`token_ids`,
`text`) and what is new since the previous step (`new_token_ids`,
`new_text`), so a streaming front forwards deltas and a non-streaming one
reads the final object, without either keeping its own state. Text that may
still turn into a stop string is held back until it cannot, so streamed
text never has to be taken back.

They are frozen msgspec Structs, not frozen dataclasses: an engine builds
three for every running request at every step, and a frozen dataclass pays
an `object.__setattr__` per field (4.2 against 0.3 us for `RequestMetrics` on
this host), about 10 us a request a step, a millisecond a step at batch 128.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from hydrant.engine.sampler import TokenLogprob

FinishReason = Literal["stop", "length", "abort", "error"]


class RequestMetrics(msgspec.Struct, frozen=True):
    """Counts and times of one request, for billing and latency metrics.

    Times are wall-clock (time.time()). `device_seconds` is this request's
    share of the device: each step's measured duration split over the
    sequences in it by the tokens each computed, summed over the request's
    steps (and its n choices).
    """

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    device_seconds: float
    num_preemptions: int = 0


class CompletionOutput(msgspec.Struct, frozen=True):
    """One of the request's `n` choices."""

    index: int
    token_ids: list[int]
    new_token_ids: list[int]
    text: str
    new_text: str
    finish_reason: FinishReason | None
    logprobs: list[TokenLogprob] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestOutput(msgspec.Struct, frozen=True):
    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    # With `prompt_logprobs`: every prompt token's score (None for the first), in the
    # first output that carries a generated token only.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # With `embed`: the prompt's normalized embedding, in the final output.
    embedding: list[float] | None = None


def merge_outputs(older: RequestOutput, newer: RequestOutput) -> RequestOutput:
    """`newer` as a reader that never saw `older` needs it: one output for both steps.

    A slow reader (a slow HTTP client, a busy gateway) then reads one output per
    wake-up instead of a backlog of one per step. The cumulative parts
    (`token_ids`, `text`, `logprobs`, `finish_reason`, `metrics`, `finished`)
    are `newer`'s already; the deltas are `older`'s followed by `newer`'s; the
    once-only parts (`prompt_logprobs` on the first output with a token,
    `embedding` on the last) are kept from whichever carried them.
    """
    earlier = {choice.index: choice for choice in older.outputs}
    choices: list[CompletionOutput] = []
    for choice in newer.outputs:
        before = earlier.pop(choice.index, None)
        if before is None:
            choices.append(choice)
            continue
        choices.append(
            CompletionOutput(
                index=choice.index,
                token_ids=choice.token_ids,
                new_token_ids=before.new_token_ids + choice.new_token_ids,
                text=choice.text,
                new_text=before.new_text + choice.new_text,
                finish_reason=choice.finish_reason,
                logprobs=choice.logprobs,
            )
        )
    if earlier:  # a choice only the older output carried keeps its unread delta
        choices.extend(earlier.values())
        choices.sort(key=lambda choice: choice.index)
    return RequestOutput(
        request_id=newer.request_id,
        outputs=choices,
        finished=newer.finished,
        metrics=newer.metrics,
        prompt_logprobs=(
            older.prompt_logprobs if older.prompt_logprobs is not None else newer.prompt_logprobs
        ),
        embedding=newer.embedding if newer.embedding is not None else older.embedding,
    )
