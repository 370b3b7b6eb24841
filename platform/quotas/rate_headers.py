"""OpenAI's `x-ratelimit-*` response headers, from the window states one admission returned.

Why these names and formats: clients built for OpenAI (its SDKs' retry logic, LiteLLM,
dashboards) read them as OpenAI sends them: `x-ratelimit-limit-requests`, `-remaining-`,
`-reset-` and the `-tokens` trio, resets as Go-style durations (`20ms`, `1s`, `6m0s`).

Which limits they report: requests are the tenant's requests per minute, else (a plan
without one) the key's per-second rate of the request's size tier; tokens are the tenant's
tokens per minute. A trio whose limit the plan does not have is left out (there is no
limit to report). `reset` is when capacity next comes back in the sliding window: the
oldest entry's exit; on a refusal by that window it is the `Retry-After` wait itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hydrant.platform.quotas.checks import WindowState
from hydrant.platform.quotas.plan import KEY_RATE, PROJECT_RPM, PROJECT_TPM, TENANT_RPM, TENANT_TPM

_REQUESTS = (TENANT_RPM, PROJECT_RPM, KEY_RATE)
_TOKENS = (TENANT_TPM, PROJECT_TPM)
# Every header this module may set (CORS exposes them to browser clients).
HEADER_NAMES = tuple(
    f"x-ratelimit-{part}-{unit}"
    for unit in ("requests", "tokens")
    for part in ("limit", "remaining", "reset")
)


def go_duration(seconds: float) -> str:
    """A duration as OpenAI writes it (Go's `time.Duration`), to the millisecond:
    `0s`, `20ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))  # never under-state a wait
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    secs = f"{whole}.{frac:03d}".rstrip("0") if frac else str(whole)
    text = f"{secs}s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


def _pick(
    windows: Sequence[WindowState], names: Sequence[str], refused: str | None
) -> WindowState | None:
    """The window a unit's headers describe: the one that refused the request; else the
    per-minute window (the tenant's or the key's project's) with the least remaining,
    the tenant's on a tie; the key's per-second tier rate only when neither is set."""
    by_name = {w.name: w for w in windows}
    if refused in names and refused in by_name:
        return by_name[refused]
    present = [by_name[n] for n in names if n in by_name]
    per_minute = [w for w in present if w.name != KEY_RATE]
    pool = per_minute or present
    return min(pool, key=lambda w: w.remaining) if pool else None


def rate_limit_headers(
    windows: Sequence[WindowState], refused: str | None = None, retry_after_s: float | None = None
) -> dict[str, str]:
    """The headers for a response; `refused` names the window that refused the request
    (its remaining is 0 and its reset the `Retry-After` wait, `retry_after_s`)."""
    headers: dict[str, str] = {}
    for unit, names in (("requests", _REQUESTS), ("tokens", _TOKENS)):
        state = _pick(windows, names, refused)
        if state is None:
            continue
        remaining, reset = state.remaining, state.reset_s
        if state.name == refused:
            remaining = 0
            if retry_after_s is not None:
                reset = retry_after_s
        headers[f"x-ratelimit-limit-{unit}"] = str(state.limit)
        headers[f"x-ratelimit-remaining-{unit}"] = str(remaining)
        headers[f"x-ratelimit-reset-{unit}"] = go_duration(reset)
    return headers
