"""What a JSON-schema mask costs a decode step: the same batches with and without one.

    .venv/bin/python bench/structured_output.py [--batches 1,16,64] [--rounds 3]

Each batch of requests (sampled, seeded, 64 new tokens each) runs through one
demo-model engine twice per round: free text (the baseline) and constrained to
`{"type": "object"}`, OpenAI's JSON mode. The table gives the mean step time of
each (the best round) and their ratio; the difference is the per-row parser
work of engine/structured_output.py (llguidance's mask, its unpacking onto the
logits, feeding back the drawn token). The demo vocabulary is 2,048 tokens; a
mask's cost grows with the vocabulary, so a 128k-vocabulary model pays more
per row. Not part of the tests.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from hydrant.engine.demo_model import write_demo_model
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.output_constraints import JSON_OBJECT_SCHEMA
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

NEW_TOKENS = 64


def progress(message: str) -> None:
    print(f"phase: {message}", file=sys.stderr, flush=True)


def step_seconds(engine: LLMEngine, batch: int, schema: str | None) -> float:
    """Mean time of the steps after the batch's prefill."""
    assert engine.tokenizer is not None
    for i in range(batch):
        constraint = None if schema is None else ("json", schema)
        params = SamplingParams(
            max_tokens=NEW_TOKENS, temperature=1.0, seed=i, structured_output=constraint
        )
        engine.add_request(
            Request(f"{time.time_ns()}-{i}", engine.tokenizer.encode(f"item {i}"), params)
        )
    engine.step()
    started, steps = time.perf_counter(), 0
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return (time.perf_counter() - started) / max(steps, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        progress("building the demo model")
        model_dir = write_demo_model(Path(tmp) / "demo")
        config = EngineConfig(kv_cache_bytes=256 << 20, show_progress=False)
        engine = LLMEngine.from_pretrained(model_dir, config)
        step_seconds(engine, 4, None)  # warm up both paths (and build the mask index)
        step_seconds(engine, 4, JSON_OBJECT_SCHEMA)
        rows = []
        for batch in (int(b) for b in args.batches.split(",")):
            free, guided = [], []
            for r in range(args.rounds):
                progress(f"batch {batch}, round {r + 1}/{args.rounds}")
                free.append(step_seconds(engine, batch, None))
                guided.append(step_seconds(engine, batch, JSON_OBJECT_SCHEMA))
            rows.append((batch, min(free), min(guided)))
    print(f"{'batch':>5} {'free ms/step':>13} {'json ms/step':>13} {'json/free':>10}")
    for batch, free_s, guided_s in rows:
        ratio = guided_s / free_s
        print(f"{batch:>5} {free_s * 1e3:>13.2f} {guided_s * 1e3:>13.2f} {ratio:>10.2f}")


if __name__ == "__main__":
    main()
