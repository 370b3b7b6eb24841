"""Factories for tiny random Hugging Face checkpoints the engine tests load.

Each builds a real transformers model (so the reference is transformers
itself), randomizes what HF initializes to constants (RMSNorm weights to 1,
biases to 0) so that loading them wrongly shows, and writes it with
`save_pretrained` in the HF layout, plus the demo tokenizer so the engine has
text to detokenize. Shapes are tiny (hidden 64-128, 2 layers): the tests run
on two shared CPU cores.

BOS/EOS are left out of the model config so `generate()` never stops early;
tests that want a stop token use `stop_token_ids`.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from hydrant.engine.demo_model import write_demo_tokenizer
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.metrics import EngineMetrics
from hydrant.engine.outputs import RequestOutput
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.scheduler import Scheduler, SchedulerOutput
from hydrant.engine.sequence import Request, RequestTimes, Sequence

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

Family = Literal["llama", "gqa", "llama3", "qwen2", "qwen3", "mistral", "wide"]
FAMILIES: tuple[Family, ...] = ("llama", "gqa", "llama3", "qwen2", "qwen3", "mistral")
VOCAB_SIZE = 2048  # the demo tokenizer's size
MAX_POSITIONS = 256

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": MAX_POSITIONS,
    "rms_norm_eps": 1e-5,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
    "initializer_range": 0.05,
}


def hf_config(family: Family) -> PretrainedConfig:
    """The transformers config of each tiny family."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    if family == "llama":
        return LlamaConfig(**_COMMON)
    if family == "gqa":
        return LlamaConfig(
            **{**_COMMON, "hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 2}
        )
    if family == "llama3":
        return LlamaConfig(
            **{**_COMMON, "num_key_value_heads": 2},
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if family == "qwen2":
        return Qwen2Config(**{**_COMMON, "num_key_value_heads": 2}, tie_word_embeddings=True)
    if family == "qwen3":  # head_dim set apart from hidden / heads, as Qwen3's own configs do
        return Qwen3Config(
            **{**_COMMON, "num_key_value_heads": 2, "head_dim": 32}, tie_word_embeddings=True
        )
    if family == "wide":  # head_dim 64 (vLLM's CPU attention needs >= 32), two int4 groups a row
        return LlamaConfig(
            **{**_COMMON, "hidden_size": 256, "intermediate_size": 256, "num_key_value_heads": 2}
        )
    if family == "mistral":
        return MistralConfig(**{**_COMMON, "num_key_value_heads": 2}, sliding_window=4096)
    raise ValueError(f"unknown family {family!r}")


@functools.cache
def tokenizer_files() -> dict[str, str]:
    """Train the demo tokenizer once per test session; copy its files into each model."""
    with tempfile.TemporaryDirectory() as tmp:
        write_demo_tokenizer(Path(tmp))
        return {
            name: (Path(tmp) / name).read_text("utf-8")
            for name in ("tokenizer.json", "tokenizer_config.json")
        }


def build_tiny_model(
    out_dir: Path, family: Family, *, seed: int = 0, max_shard_size: str | None = None
) -> Path:
    """Write a tiny random float32 checkpoint of `family` into `out_dir` and return it."""
    from transformers import AutoModelForCausalLM

    config = hf_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if max_shard_size is None:
        model.save_pretrained(out_dir)
    else:
        model.save_pretrained(out_dir, max_shard_size=max_shard_size)
    for name, text in tokenizer_files().items():
        (out_dir / name).write_text(text, "utf-8")
    return out_dir


def load_hf_model(model_dir: Path) -> PreTrainedModel:
    """The transformers reference, read back from the same files the engine loads."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


def hf_greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' `generate(do_sample=False)` continuation of one unpadded prompt."""
    generate: Any = model.generate  # transformers' stubs type it oddly
    with torch.inference_mode():
        out = generate(
            torch.tensor([prompt]),
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
    return [int(t) for t in out[0, len(prompt) :]]


# ---- engine helpers ---------------------------------------------------------------------


def assert_no_kv_leak(engine: LLMEngine) -> None:
    """Every block back in the pool and no reference left: nothing leaked."""
    bm = engine.scheduler.block_manager
    assert not engine.has_unfinished(), "engine still has requests"
    assert bm.num_free_blocks == bm.num_blocks, (
        f"{bm.num_blocks - bm.num_free_blocks} KV blocks leaked"
    )
    assert all(bm.ref_count(b) == 0 for b in range(bm.num_blocks))


def run_to_completion(engine: LLMEngine, max_steps: int = 10_000) -> dict[str, RequestOutput]:
    """Step until the engine drains; the final output of each request, by id."""
    finals: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished():
            break
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output
    else:
        raise AssertionError(f"engine did not drain in {max_steps} steps")
    return finals


_batch_ids = itertools.count()


def run_batch(
    engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]
) -> dict[int, list[RequestOutput]]:
    """Submit prompt i with params i, step until the engine drains; every output of each
    request, by i (request ids are fresh on every call, so one engine serves many)."""
    tag = f"b{next(_batch_ids)}-"
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(Request(f"{tag}{i}", prompt, p))
    seen: dict[str, list[RequestOutput]] = {}
    while engine.has_unfinished():
        for output in engine.step():
            seen.setdefault(output.request_id, []).append(output)
    return {int(rid.removeprefix(tag)): outs for rid, outs in seen.items()}


class EngineTracker:
    """Makes engines for a test and, at teardown, drains each and checks for KV leaks."""

    def __init__(self) -> None:
        self.engines: list[LLMEngine] = []

    def make(
        self, model_dir: Path, metrics: EngineMetrics | None = None, **config: Any
    ) -> LLMEngine:
        settings = {"kv_cache_bytes": 1 << 22, "show_progress": False, **config}
        engine = LLMEngine.from_pretrained(model_dir, EngineConfig(**settings), metrics)
        self.engines.append(engine)
        return engine

    def check(self) -> None:
        for engine in self.engines:
            run_to_completion(engine)
            assert_no_kv_leak(engine)


def record_block_copies(engine: LLMEngine) -> list[int]:
    """Spy on the engine's scheduler: the list gets each step's copy-on-write block copies."""
    counts: list[int] = []
    schedule = engine.scheduler.schedule

    def spy() -> SchedulerOutput:
        out = schedule()
        counts.append(len(out.block_copies))
        return out

    engine.scheduler.schedule = spy  # type: ignore[method-assign]
    return counts


def random_prompts(count: int, low: int, high: int, seed: int = 0) -> list[list[int]]:
    """`count` random prompts with lengths in [low, high), reproducible by seed."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high, (count,), generator=generator).tolist()
    return [torch.randint(0, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


_ids = itertools.count()


class SchedulerSim:
    """The real scheduler and block manager with a fake model: each completing sequence
    gets token 1. Cheap enough for hundreds of steps; service is what the scheduler grants."""

    def __init__(self, num_blocks: int = 400, **config: int) -> None:
        settings = {"max_num_seqs": 8, "max_num_batched_tokens": 64, "short_lane_tokens": 64}
        self.config = EngineConfig(**{**settings, **config})
        self.scheduler = Scheduler(self.config, num_blocks)
        self.bm = self.scheduler.block_manager
        self.clock = 0.0

    def submit(
        self, tenant: str, weight: float = 1.0, priority: int = 0, prompt: int = 32, out: int = 32
    ) -> Request:
        """Add a request of `prompt` tokens that finishes after `out` output tokens."""
        self.clock += 1e-3
        rid = next(_ids)
        request = Request(
            request_id=f"{tenant}-{rid}",
            prompt_token_ids=[(rid * 7 + i) % 1000 for i in range(prompt)],
            params=SamplingParams(max_tokens=out),
            tenant_id=tenant,
            tenant_weight=weight,
            priority=priority,
            times=RequestTimes(self.clock),
        )
        request.seqs.append(Sequence(request, 0, None))
        self.scheduler.add_request(request)
        return request

    def step(self) -> Counter[str]:
        """One scheduled step; returns tokens served per tenant."""
        out = self.scheduler.schedule()
        self.scheduler.on_step_done(out)
        served: Counter[str] = Counter()
        for item in out.scheduled:
            served[item.seq.request.tenant_id] += item.num_new_tokens
            if item.completes:
                seq = item.seq
                seq.output_token_ids.append(1)
                if len(seq.output_token_ids) >= seq.request.params.max_tokens:
                    self.scheduler.finish_seq(seq, "length")
        return served

    def unfinished(self, tenant: str) -> list[Sequence]:
        return [
            s
            for s in (*self.scheduler.waiting, *self.scheduler.running)
            if s.request.tenant_id == tenant
        ]

    def waiting(self, tenant: str) -> int:
        return sum(1 for s in self.scheduler.waiting if s.request.tenant_id == tenant)

    def drain(self) -> None:
        while self.scheduler.has_unfinished():
            self.step()
        assert self.bm.num_free_blocks == self.bm.num_blocks
