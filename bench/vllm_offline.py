"""vLLM's offline `LLM.generate` on a token-id trace; run by bench/engine_throughput.py.

It runs in the peers' environment (`.peers/bin/python`, see bench/peers_env.sh), not in
Hydrant's: it imports vLLM only. Input on stdin, one JSON object:

    {"model_dir": DIR, "requests": [[prompt token ids, max_tokens], ...], "threads": N,
     "kv_gib": G}

Output on stdout, on the line that starts with `vllm-offline-result: `: {"seconds",
"output_tokens", "latencies"} where the
latencies are each request's completion time from the start of `generate` (recorded
through `use_tqdm`, which `LLM.generate` calls as each request finishes). float32,
greedy, EOS ignored, prefix caching off, no tokenizer (token ids in and out); every
other setting is vLLM's default. `threads` binds that many OpenMP threads to cores
0..N-1 (`VLLM_CPU_OMP_THREADS_BIND`); 0 keeps vLLM's own choice.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MARKER = "vllm-offline-result: "  # vLLM writes its own lines to stdout too


class _Clock:
    """Stands in for tqdm in `LLM.generate(use_tqdm=...)`: notes when requests finish."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()
        self.n = 0
        self.postfix = ""
        self.finished: list[float] = []

    @property
    def format_dict(self) -> dict[str, float]:
        return {"elapsed": max(1e-9, time.perf_counter() - self.start)}

    def update(self, n: int = 1) -> None:
        now = time.perf_counter()
        self.n += n
        self.finished += [now] * n

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        pass


def main() -> None:
    job = json.loads(sys.stdin.read())
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(job.get("kv_gib", 2))
    if job.get("threads"):
        n = int(job["threads"])
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{n - 1}" if n > 1 else "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=job["model_dir"],
        dtype="float32",
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        seed=0,
    )
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids, _ in job["requests"]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=False)
        for _, m in job["requests"]
    ]
    clock: list[_Clock] = []

    def factory(*args: Any, **kwargs: Any) -> Any:
        if args:  # the prompts' rendering loop wraps its iterable: hand it back as is
            return args[0]
        clock.append(_Clock())
        return clock[-1]

    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=factory)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    latencies = [t - start for t in clock[-1].finished] if clock else [seconds] * len(outputs)
    result = {"seconds": seconds, "output_tokens": tokens, "latencies": latencies}
    print(MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
