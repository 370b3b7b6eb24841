"""Tiny PEFT LoRA adapters for the engine's adapter tests, and their merged references.

Each adapter is made by `peft` itself (`get_peft_model` + `save_pretrained`), so its files
are exactly what a tenant uploads; `init_lora_weights=False` draws both A and B at random
(PEFT's default B is zero, a delta of nothing). The reference is transformers with the
adapter merged into the base weights (`merge_and_unload`), an independent computation of
the same model.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tiny_models import load_hf_model

from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelOutput
from hydrant.engine.protocol import AdapterRef
from hydrant.engine.scheduler import SchedulerOutput

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    alpha: float
    targets: tuple[str, ...]
    rslora: bool = False


def build_adapter(base_dir: Path, out_dir: Path, spec: AdapterSpec, seed: int) -> AdapterRef:
    """Write a random LoRA adapter of `spec` for the base model in `base_dir`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(spec.targets),
        use_rslora=spec.rslora,
        init_lora_weights=False,
        lora_dropout=0.0,
        bias="none",
    )
    with _peft_on_new_transformers():
        model = get_peft_model(load_hf_model(base_dir), config)
        model.save_pretrained(out_dir)
    return AdapterRef(name=out_dir.name, path=str(out_dir))


def edit_config(ref: AdapterRef, **changes: object) -> None:
    """Rewrite fields of an adapter's adapter_config.json (configs the engine refuses)."""
    path = Path(ref.path) / "adapter_config.json"
    raw = json.loads(path.read_text())
    raw.update(changes)
    path.write_text(json.dumps(raw))


def merged_model(base_dir: Path, ref: AdapterRef | None) -> torch.nn.Module:
    """transformers' model with the adapter merged into its weights (None: the base)."""
    from peft import PeftModel

    base = load_hf_model(base_dir)
    if ref is None:
        return base
    with _peft_on_new_transformers():
        return PeftModel.from_pretrained(base, ref.path).merge_and_unload().eval()


@contextlib.contextmanager
def _peft_on_new_transformers() -> Iterator[None]:
    """peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` (a FutureWarning,
    an error under our pytest settings); only that warning is silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
        yield


def reference_logits(model: torch.nn.Module, prompt: list[int], output: list[int]) -> torch.Tensor:
    """Logits [len(output), V] the merged model gives for each generated position."""
    tokens = torch.tensor([prompt + output[:-1]])
    with torch.inference_mode():
        logits = model(tokens).logits[0]
    return logits[len(prompt) - 1 :].float()


def record_logits(engine: LLMEngine) -> dict[str, list[torch.Tensor]]:
    """Spy on the runner: each request's logits row, step by step (the engine's own)."""
    seen: dict[str, list[torch.Tensor]] = defaultdict(list)
    execute = engine.runner.execute

    def spy(out: SchedulerOutput) -> ModelOutput:
        result = execute(out)
        for row, seq in enumerate(result.sample_seqs):
            seen[seq.request.request_id].append(result.logits[row].clone())
        return result

    engine.runner.execute = spy  # type: ignore[method-assign]
    return seen
