"""The embedded default's engines: one in-process engine per configured model.

This is the only place outside `hydrant.engine` that builds engines; the
gateway sees them through `EngineClient` like any remote worker pool.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from hydrant.platform.models.registry import ModelRegistry, ServedModel
from hydrant.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class EmbeddedEngines:
    registry: ModelRegistry = field(default_factory=ModelRegistry)
    engines: list[object] = field(default_factory=list)
    metric_registries: list[CollectorRegistry] = field(default_factory=list)

    async def shutdown(self) -> None:
        for engine in self.engines:
            await engine.shutdown()  # type: ignore[attr-defined]


def load_embedded_engines(settings: Settings) -> EmbeddedEngines:
    """Load every served model onto `settings.device` (blocking: call before serving)."""
    from hydrant.engine.async_engine import AsyncLLMEngine
    from hydrant.engine.engine_config import (
        EngineConfig,
        default_background_step_tokens,
        default_max_num_seqs,
        parse_num_threads,
    )
    from hydrant.engine.inprocess import InProcessEngineClient
    from hydrant.engine.llm_engine import LLMEngine
    from hydrant.engine.metrics import EngineMetrics

    loaded = EmbeddedEngines()
    for spec in settings.served_models():
        started = time.perf_counter()
        log.info("loading model", extra={"model": spec.name, "path": str(spec.path)})
        metrics_registry = CollectorRegistry()
        config = EngineConfig(
            device=settings.device,
            dtype=settings.dtype,
            kv_cache_bytes=settings.kv_cache_bytes,
            max_num_seqs=settings.max_num_seqs or default_max_num_seqs(settings.device),
            long_lane_tokens=settings.long_lane_tokens,
            quantization=settings.quantization,  # type: ignore[arg-type]  # validated there
            kv_cache_dtype=settings.kv_cache_dtype,
            enforce_eager=settings.enforce_eager,
            enable_prefix_caching=settings.enable_prefix_caching,
            num_threads=parse_num_threads(settings.engine_threads),
            max_prefill_tokens_while_decoding=settings.max_prefill_tokens_while_decoding or None,
            max_background_step_tokens=default_background_step_tokens(
                settings.max_background_step_tokens, settings.device
            ),
            max_loras=settings.max_loras,
            max_cpu_loras=settings.max_cpu_loras,
            max_lora_rank=settings.max_lora_rank,
        )
        engine = LLMEngine.from_pretrained(
            spec.path, config, metrics=EngineMetrics(metrics_registry, model=spec.name)
        )
        if engine.tokenizer is None:
            raise RuntimeError(f"model {spec.name} has no tokenizer.json: it cannot be served")
        front = AsyncLLMEngine(engine)
        loaded.engines.append(front)
        loaded.metric_registries.append(metrics_registry)
        loaded.registry.add(
            ServedModel(
                name=spec.name,
                tokenizer=engine.tokenizer,
                client=InProcessEngineClient(front),
                max_model_len=engine.max_model_len,
                max_num_seqs=config.max_num_seqs,
                block_size=config.block_size,
                tool_call_parser=settings.tool_call_parser(spec.name),
            )
        )
        log.info(
            "model loaded",
            extra={"model": spec.name, "seconds": round(time.perf_counter() - started, 2)},
        )
    return loaded
