"""Refuse prompts made mostly of special tokens, and block sources that keep sending them.

The field's attack: a prompt of thousands of `<s><s><s>…` (BOS or other
special tokens, which tokenizers honour when they appear in the text) costs a
full prefill, and degenerate attention over it, for nothing a user could want.
One such prompt is refused (400); a source that sends `strikes` of them within
`window_s` is blocked for `block_s` (429 with Retry-After).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence

from hydrant.platform.errors import InvalidRequest, RateLimited


class AbuseGuard:
    def __init__(
        self,
        *,
        max_special_ratio: float = 0.5,
        min_tokens: int = 32,
        strikes: int = 3,
        window_s: float = 60.0,
        block_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.max_special_ratio = max_special_ratio
        self.min_tokens = min_tokens
        self.strikes = strikes
        self.window_s = window_s
        self.block_s = block_s
        self._clock = clock
        self._on_event = on_event or (lambda event: None)
        self._strikes: dict[str, deque[float]] = defaultdict(deque)
        self._blocked_until: dict[str, float] = {}

    def blocked_sources(self) -> int:
        now = self._clock()
        return sum(1 for until in self._blocked_until.values() if until > now)

    def check(
        self,
        source: str,
        prompt_ids: Sequence[int],
        special_ids: frozenset[int],
        param: str = "messages",
    ) -> None:
        """Raise if `source` is blocked or this prompt is mostly special tokens."""
        now = self._clock()
        until = self._blocked_until.get(source)
        if until is not None:
            if until > now:
                self._on_event("blocked")
                raise RateLimited(
                    "this API key is blocked for repeatedly sending prompts made of special tokens",
                    code="abuse_blocked",
                    retry_after=until - now,
                )
            del self._blocked_until[source]
        if len(prompt_ids) < self.min_tokens or not special_ids:
            return
        special = sum(map(special_ids.__contains__, prompt_ids))  # in C, per token
        if special / len(prompt_ids) < self.max_special_ratio:
            return
        self._on_event("special_tokens")
        history = self._strikes[source]
        history.append(now)
        while history and history[0] < now - self.window_s:
            history.popleft()
        if len(history) >= self.strikes:
            self._blocked_until[source] = now + self.block_s
            history.clear()
            self._on_event("source_blocked")
        raise InvalidRequest(
            f"the prompt is {special} of {len(prompt_ids)} special tokens (BOS/EOS and the "
            "like); such prompts are refused",
            param=param,
            code="abusive_prompt",
        )
