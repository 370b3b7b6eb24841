"""Context isolation: batched conversations never see each other's content.

Three conversations, each carrying its own marker fact, are sent alone and then
interleaved in one batch with filler traffic. Two things must hold:
no reply (echoed prompt or completion) carries another conversation's marker,
and with a fixed seed the completion is token-for-token the same alone and
batched. The second is what catches a wrong KV block or a crossed row on any
model, including a demo model whose text is noise: a leak changes the tokens.
"""

from __future__ import annotations

import asyncio
import secrets

from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession, Reply

CONVERSATIONS = 3
MAX_TOKENS = 16


def conversation(marker: str, turn: int) -> str:
    return (
        f"User: remember this fact: the code word is {marker}.\n"
        f"Assistant: noted, the code word is {marker}.\n"
        f"User: question {turn}: what is the code word?\nAssistant:"
    )


def leaks(markers: list[str], index: int, reply: Reply) -> list[str]:
    """Markers of other conversations found in a reply (its echoed prompt or completion)."""
    return [m for j, m in enumerate(markers) if j != index and m in reply.text]


async def check_context_isolation(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    name = "context isolation"
    threshold = "0 crossed markers; seeded output identical"
    markers = [f"MARK{secrets.token_hex(4).upper()}" for _ in range(CONVERSATIONS)]
    seeds = [1000 + i for i in range(CONVERSATIONS)]
    prompts = [conversation(m, i) for i, m in enumerate(markers)]

    async def ask(i: int) -> Reply:
        return await s.complete(prompts[i], MAX_TOKENS, seed=seeds[i], temperature=1.0, echo=True)

    alone = [await ask(i) for i in range(CONVERSATIONS)]
    fillers = [s.complete(s.prompt_of(48, f"filler {k}"), MAX_TOKENS) for k in range(6)]
    batched_and_fillers = await asyncio.gather(
        *[x for i in range(CONVERSATIONS) for x in (ask(i), fillers[2 * i], fillers[2 * i + 1])]
    )
    batched = list(batched_and_fillers[::3])
    bad = [r for r in [*alone, *batched_and_fillers] if not r.ok]
    if bad:
        return CheckResult.judge(
            name, False, threshold, "-", f"{len(bad)} requests failed (first: {bad[0].status})"
        )
    crossed = [
        f"conversation {i} carries {m}"
        for i in range(CONVERSATIONS)
        for reply in (alone[i], batched[i])
        for m in leaks(markers, i, reply)
    ]
    missing_own = [i for i in range(CONVERSATIONS) if markers[i] not in batched[i].text]
    differing = [
        i
        for i in range(CONVERSATIONS)
        if alone[i].text != batched[i].text or alone[i].prompt_tokens != batched[i].prompt_tokens
    ]
    measured = f"{len(crossed)} crossed, {len(differing)}/{CONVERSATIONS} differ"
    problems = crossed + [f"conversation {i}: own marker not echoed" for i in missing_own]
    problems += [f"conversation {i}: seeded output differs alone vs batched" for i in differing]
    return CheckResult.judge(name, not problems, threshold, measured, "; ".join(problems))
