"""Capacity sanity: can `max_num_seqs` sequences of the observed length all hold their KV?

The arithmetic is engine/capacity.py's (`plan_capacity`), applied to what the
engine actually allocated instead of a memory estimate: a sequence of L tokens
holds ceil(L / block_size) blocks, so at the p99 length the pool holds
`num_blocks // blocks_per_seq` sequences. A `max_num_seqs` above that is the
field's trap: 256 sequences configured, a fraction of them fit, the rest queue
or are preempted and recomputed. Lengths are the ledger's recent entries
(`GET /admin/engines`); with none yet, every sequence is assumed to reach
`max_model_len`, the worst case.
"""

from __future__ import annotations

import math
from typing import Any

from hydrant.platform.preflight.options import PreflightOptions
from hydrant.platform.preflight.report import CheckResult
from hydrant.platform.preflight.session import PreflightSession


def sequences_that_fit(num_blocks: int, block_size: int, seq_tokens: int) -> int:
    return num_blocks // max(math.ceil(seq_tokens / block_size), 1)


def judge_capacity(engine: dict[str, Any]) -> CheckResult:
    name = "capacity sanity"
    configured = engine.get("max_num_seqs")
    blocks, block_size = engine.get("num_total_blocks"), engine.get("block_size")
    if configured is None or blocks is None or block_size is None:
        return CheckResult.skip(name, "max_num_seqs <= fit", "engine limits not reported")
    observed = engine.get("observed")
    if observed:
        p99 = int(observed["prompt_p99"]) + int(observed["output_p99"])
        basis = f"p99 {p99} tokens over {observed['samples']} requests"
    else:
        p99 = int(engine["max_model_len"])
        basis = f"no traffic yet: max_model_len {p99}"
    fit = sequences_that_fit(int(blocks), int(block_size), p99)
    measured = f"max_num_seqs {configured}, {fit} fit ({basis})"
    detail = ""
    if configured > fit:
        detail = (
            f"{configured} sequences cannot all hold KV at {p99} tokens "
            f"({blocks} blocks of {block_size}): set max_num_seqs <= {fit} or raise the KV budget"
        )
    return CheckResult.judge(
        name, configured <= fit, "max_num_seqs <= sequences that fit", measured, detail
    )


async def check_capacity(s: PreflightSession, o: PreflightOptions) -> CheckResult:
    engine = await s.engine()
    if engine is None:
        return CheckResult.skip(
            "capacity sanity", "max_num_seqs <= fit", "GET /admin/engines is not available"
        )
    return judge_capacity(engine)
