"""Embedding throughput of the Hydrant engine against transformers' batched forward, on CPU.

A fixed, seeded set of inputs (lengths log-normal, clipped to 8-512 tokens) is
embedded by

* Hydrant: every input an `embed` request submitted at t=0 (continuous batching,
  chunked prefill, paged KV; the vector is the last token's final hidden state,
  normalized);
* transformers: the base model's forward over static batches sorted by length
  (as sentence-transformers batches, so padding is small), right-padded with an
  attention mask, the last real token's hidden state gathered and normalized.

on the demo model and on a ~100M-parameter Llama-shaped random model. It prints
inputs/s and input tokens/s of each, Hydrant's ratio to each baseline, and the
largest L2 distance between the two engines' vectors (they must agree).

Usage: python bench/embeddings.py [--quick] [--threads N] [--models demo,100m]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import SHAPE_100M, build_100m, progress

from hydrant.engine.demo_model import DEMO_VOCAB_SIZE, write_demo_model
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

SEED = 20261204
EMBED = SamplingParams(max_tokens=0, embed=True)


@dataclass
class Result:
    name: str
    seconds: float
    tokens: int
    count: int
    vectors: list[torch.Tensor]

    @property
    def inputs_per_s(self) -> float:
        return self.count / self.seconds

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def inputs(count: int, vocab: int) -> list[list[int]]:
    rng = random.Random(SEED)
    lengths = [int(min(512, max(8, rng.lognormvariate(math.log(64), 0.9)))) for _ in range(count)]
    return [[rng.randrange(1, vocab) for _ in range(n)] for n in lengths]


def run_hydrant(model_dir: Path, prompts: list[list[int]]) -> Result:
    config = EngineConfig(kv_cache_bytes=512 << 20, show_progress=False, max_num_seqs=256)
    engine = LLMEngine.from_pretrained(model_dir, config)
    for i, prompt in enumerate(prompts[:8]):  # warm up
        engine.add_request(Request(f"warm-{i}", prompt, EMBED))
    while engine.has_unfinished():
        engine.step()
    vectors: dict[int, torch.Tensor] = {}
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(str(i), prompt, EMBED))
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished and output.embedding is not None:
                vectors[int(output.request_id)] = torch.tensor(output.embedding)
    seconds = time.perf_counter() - started
    tokens = sum(len(p) for p in prompts)
    return Result(
        "hydrant", seconds, tokens, len(prompts), [vectors[i] for i in range(len(prompts))]
    )


def run_transformers(model_dir: Path, prompts: list[list[int]], batch_size: int) -> Result:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]), reverse=True)
    vectors: dict[int, torch.Tensor] = {}

    def embed(batch: list[int]) -> None:
        width = max(len(prompts[i]) for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : len(prompts[i])] = torch.tensor(prompts[i])
            mask[row, : len(prompts[i])] = 1
        with torch.inference_mode():
            hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        last = mask.sum(dim=1) - 1
        pooled = hidden[torch.arange(len(batch)), last].float()
        for row, i in enumerate(batch):
            vectors[i] = torch.nn.functional.normalize(pooled[row], dim=0)

    embed(order[:4])  # warm up
    started = time.perf_counter()
    for at in range(0, len(order), batch_size):
        embed(order[at : at + batch_size])
    seconds = time.perf_counter() - started
    tokens = sum(len(p) for p in prompts)
    name = f"transformers bs={batch_size}"
    return Result(name, seconds, tokens, len(prompts), [vectors[i] for i in range(len(prompts))])


def print_table(model: str, results: list[Result]) -> None:
    ours = results[0]
    print(f"\n{model}: {ours.count} inputs, {ours.tokens} tokens")
    print(f"{'engine':<20} {'inputs/s':>9} {'tokens/s':>10} {'hydrant x':>10} {'max L2 diff':>12}")
    for result in results:
        ratio = result.seconds / ours.seconds
        diff = max(float((a - b).norm()) for a, b in zip(ours.vectors, result.vectors, strict=True))
        print(
            f"{result.name:<20} {result.inputs_per_s:>9.1f} {result.tokens_per_s:>10.0f} "
            f"{ratio:>10.2f} {diff:>12.2e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer inputs")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    parser.add_argument("--models", default="demo,100m")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    count = 64 if args.quick else 256
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            progress(f"{model}: building the checkpoint")
            if model == "demo":
                model_dir, vocab = write_demo_model(Path(tmp) / "demo"), DEMO_VOCAB_SIZE
            else:
                model_dir, vocab = build_100m(Path(tmp) / "100m"), SHAPE_100M["vocab_size"]
            prompts = inputs(count, vocab)
            progress(f"{model}: hydrant, {count} inputs")
            results = [run_hydrant(model_dir, prompts)]
            for batch_size in (8, 32):
                progress(f"{model}: transformers, batches of {batch_size}")
                results.append(run_transformers(model_dir, prompts, batch_size))
            print_table(model, results)


if __name__ == "__main__":
    main()
