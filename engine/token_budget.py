"""The per-step token budget, split into a short lane and a long lane.

Step time grows with the tokens in it, and every running request waits for
the whole step. If one 8k-token prompt could take a step's whole budget,
every short request's next token would wait for that prefill. So requests
are tiered by prompt length: short ones draw on `short_lane_tokens`, long
ones on `long_lane_tokens`, and both on `max_num_batched_tokens`. While long
requests have work, the short lane may not eat into the part of the total
the long lane is entitled to, so neither tier can starve the other.
"""

from __future__ import annotations

from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.sequence import LONG_LANE, Lane


class TokenBudget:
    """What is left of one step's token budget, per lane and in total."""

    def __init__(self, config: EngineConfig, long_demand: int) -> None:
        self.total_left = config.max_num_batched_tokens
        self._lane_left = {"short": config.short_lane_tokens, "long": config.long_lane_tokens}
        self._long_reserved = min(long_demand, config.long_lane_tokens, self.total_left)

    def grant(self, lane: Lane, wanted: int) -> int:
        """Take up to `wanted` tokens for `lane`; returns how many were granted (may be 0)."""
        if lane == LONG_LANE:
            available = min(self._lane_left[lane], self.total_left)
        else:
            available = min(self._lane_left[lane], self.total_left - self._long_reserved)
        granted = max(0, min(wanted, available))
        self._lane_left[lane] -= granted
        self.total_left -= granted
        if lane == LONG_LANE:
            self._long_reserved = max(0, self._long_reserved - granted)
        return granted

    def refund(self, lane: Lane, tokens: int) -> None:
        """Give back a grant that could not be used (its sequence was preempted)."""
        self._lane_left[lane] += tokens
        self.total_left += tokens

    def lane_left(self, lane: Lane) -> int:
        return self._lane_left[lane]
