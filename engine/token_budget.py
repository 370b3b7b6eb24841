"""The per-step token budget, split into a short lane and a long lane.

Step time grows with the tokens in it, and every running request waits for
the whole step. If one 8k-token prompt could take a step's whole budget,
every short request's next token would wait for that prefill. So requests
are tiered by prompt length: short ones draw on `short_lane_tokens`, long
ones on `long_lane_tokens`, and both on `max_num_batched_tokens`. While long
requests have work, the short lane may not eat into the part of the total
the long lane is entitled to, so neither tier can starve the other.

In a step that runs decodes, prefill chunks (new prompts and the rest of
chunked ones) together get at most `max_prefill_tokens_while_decoding`:
one 2048-token chunk makes a step several times longer than a decode step,
and every running request's next token waits for it (the inter-token
latency spikes of issue #24). The cap grows while more requests wait for their
prefill than decode (`prefill_cap`): a chunk's stall then falls on few streams and
starts many (the head of a burst). Within that cap each lane is entitled to half
while it has prompt work, so short prompts still start beside a long one
and a flood of short ones does not stop a long one. A
step without decodes prefills with the whole budget; the cap is at least
one token, so prefill progresses in every step.

Background work (batch lines) has a cap of its own, `background_cap`
(`max_background_step_tokens`), on its decodes and prompt chunks together in
a step. The scheduler runs background work only in steps without foreground
work, but a foreground request that arrives meanwhile waits for the step in
progress to end: a step of eight background prompts at once is several times
a decode step (issue #27). Capped, background prompts are chunked over small
steps, beside the other lines' decodes, which costs them little: no foreground
stream is in those steps to wait on them.
"""

from __future__ import annotations

from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.sequence import LONG_LANE, SHORT_LANE, Lane


def prefill_cap(base: int | None, decoding: int, waiting: int, total: int) -> int | None:
    """The prompt tokens a step with `decoding` decodes may take while `waiting` requests
    wait for their prefill: `base`, times how many more wait than decode.

    A prompt chunk delays every decoding stream's next token by its compute time, so its
    cost grows with the streams decoding; what it buys is a start for the requests that
    wait. When many more wait than decode (the head of a burst: a few streams started,
    the rest queued), a large chunk stalls few streams and starts many; the fixed cap
    would make the whole queue wait through one small chunk a step (issue #24: the
    unbounded rate's TTFT). As the running set fills, the ratio falls and the cap returns
    to `base`, where the streams' inter-token latency is what matters.
    """
    if base is None or decoding <= 0 or waiting <= decoding:
        return base
    return max(base, min(total, base * waiting // decoding))


class TokenBudget:
    """What is left of one step's token budget, per lane and in total."""

    def __init__(
        self,
        config: EngineConfig,
        long_demand: int,
        short_prefill_demand: int = 0,
        background_cap: int | None = None,
        queue: tuple[int, int] = (0, 0),
    ) -> None:
        self.total_left = config.max_num_batched_tokens
        self.background_left = self.total_left if background_cap is None else background_cap
        self._lane_left = {"short": config.short_lane_tokens, "long": config.long_lane_tokens}
        self._long_reserved = min(long_demand, config.long_lane_tokens, self.total_left)
        self._prefill_cap = prefill_cap(
            config.max_prefill_tokens_while_decoding, *queue, config.max_num_batched_tokens
        )
        # each lane's floor within the cap: half of it, or its whole demand if smaller
        half = (self._prefill_cap or 0) // 2
        self._prefill_floor = {
            "long": min(long_demand, half),
            "short": min(short_prefill_demand, half),
        }
        self._prefill_used = {"short": 0, "long": 0}
        self._decoding = False  # a decode was granted: the prefill cap applies

    def grant(
        self, lane: Lane, wanted: int, *, prefill: bool = False, background: bool = False
    ) -> int:
        """Take up to `wanted` tokens for `lane`; returns how many were granted (may be 0).

        `prefill` says the tokens are a prompt chunk rather than a decode; decodes are
        granted first in a step, so the prefill cap knows whether it applies.
        `background` says they are background work, which also draws on `background_left`.
        """
        if lane == LONG_LANE:
            available = min(self._lane_left[lane], self.total_left)
        else:
            available = min(self._lane_left[lane], self.total_left - self._long_reserved)
        if prefill:
            available = min(available, self._prefill_room(lane))
        if background:
            available = min(available, self.background_left)
        granted = max(0, min(wanted, available))
        if background:
            self.background_left -= granted
        self._lane_left[lane] -= granted
        self.total_left -= granted
        if lane == LONG_LANE:
            self._long_reserved = max(0, self._long_reserved - granted)
        if prefill:
            self._prefill_used[lane] += granted
        elif granted:
            self._decoding = True
        return granted

    def _prefill_room(self, lane: Lane) -> int:
        """What the cap leaves `lane`: the cap less what both lanes took, less what the
        other lane is still owed of its floor (so whichever is scheduled first, a running
        long prefill or a waiting short prompt, cannot take the whole cap)."""
        if self._prefill_cap is None or not self._decoding:
            return self.total_left
        other: Lane = SHORT_LANE if lane == LONG_LANE else LONG_LANE
        owed = max(0, self._prefill_floor[other] - self._prefill_used[other])
        used = self._prefill_used[SHORT_LANE] + self._prefill_used[LONG_LANE]
        return max(0, self._prefill_cap - used - owed)

    @property
    def prefill_exhausted(self) -> bool:
        """No prompt chunk of either lane fits in this step any more."""
        return self._prefill_room(LONG_LANE) == 0 and self._prefill_room(SHORT_LANE) == 0

    def refund(
        self, lane: Lane, tokens: int, *, prefill: bool = False, background: bool = False
    ) -> None:
        """Give back a grant that could not be used (its sequence was preempted)."""
        if background:
            self.background_left += tokens
        self._lane_left[lane] += tokens
        self.total_left += tokens
        if prefill:
            self._prefill_used[lane] -= tokens

    def lane_left(self, lane: Lane) -> int:
        return self._lane_left[lane]
