"""What the gateway and an engine say to each other: plain data, no torch.

The same structs travel msgspec-encoded over a worker's internal HTTP API and
are passed as objects to the in-process engine on the embedded default, so the
platform talks to both through one `EngineClient` interface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

from hydrant.engine.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort", "error"]


class Sampling(msgspec.Struct, frozen=True, kw_only=True):
    """The wire form of `SamplingParams` (same fields, same defaults)."""

    n: int = 1
    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured_output: tuple[str, str] | None = None
    structured_output_after: int | None = None
    embed: bool = False
    embed_dimensions: int | None = None

    def to_params(self) -> SamplingParams:
        return SamplingParams(**{f: getattr(self, f) for f in self.__struct_fields__})


# Requests at this priority or a larger one are background work (the Batch API's lines):
# the scheduler computes them only in steps where no foreground request is running, so
# they fill the engine's idle time and never lengthen a foreground request's steps.
BACKGROUND_PRIORITY = 1_000_000


class AdapterRef(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter a request runs with (issue #28).

    The gateway sends the registered path with every request, so an engine loads an adapter
    on its first use and a hot-added adapter needs no restart or push to the workers.
    """

    name: str
    path: str

    @property
    def key(self) -> str:
        """What an engine holds it under (host memory, device slot, prefix cache): its name
        and directory. An admin may remove an adapter and register a new version under the
        same name at another directory, without a restart; keyed by name alone, engines
        would answer it with the old weights and the old K/V."""
        return f"{self.name}\0{self.path}"


class GenerateRequest(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling
    tenant_id: str = "default"
    tenant_weight: float = 1.0
    priority: int = 0
    adapter: AdapterRef | None = None


class TokenLogprob(msgspec.Struct, frozen=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class ChoiceDelta(msgspec.Struct, frozen=True, kw_only=True):
    """What one of the `n` choices produced since the previous chunk."""

    index: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None
    logprobs: list[TokenLogprob] | None = None


class RequestUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Exact counts for billing, and the engine's measured share of device time."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    device_ns: int
    queue_seconds: float | None = None
    first_token_seconds: float | None = None
    e2e_seconds: float | None = None


class GenerateChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One step's output for a request; the last one has `finished` and `usage` set."""

    request_id: str
    choices: list[ChoiceDelta]
    finished: bool = False
    # With `prompt_logprobs`: one entry per prompt token (None for the first), on the first
    # chunk that carries a generated token.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # With `embed`: the prompt's embedding, on the last chunk (its only one).
    embedding: list[float] | None = None
    usage: RequestUsage | None = None
    error: str | None = None


class EngineStats(msgspec.Struct, frozen=True, kw_only=True):
    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_hit_rate: float
    # Names of the LoRA adapters resident on the engine now, so dispatch can prefer a
    # worker that will not have to load the one a request names.
    loaded_adapters: tuple[str, ...] = ()


class EngineClient(Protocol):
    """One model's engine as the gateway sees it, in this process or behind HTTP."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream chunks (an async generator); `InvalidRequestError` comes before the first."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
