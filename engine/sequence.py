"""Requests and the token sequences they generate.

A `Request` is what a client asked for, built once (from the wire's
`GenerateRequest` by engine/inprocess.py, or by a caller of
`LLMEngine.add_request`) and passed as that same object from the async front
to the scheduler. Each of its `n` choices is a `Sequence`, the unit the
scheduler and block manager work on. A request starts with one sequence; when
its prompt has been computed it forks into `n` sequences that share the
prompt's KV blocks (copy-on-write), so the prompt is computed once however
many choices are asked for.

A sequence tracks `num_computed_tokens`: how many of its tokens have their
K/V in the cache. Prefill, chunked prefill, decode and recompute after
preemption are then one rule: compute the tokens from `num_computed_tokens`
to the end. Tokens are kept as the request's prompt (shared, never copied)
plus the sequence's own outputs.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import struct
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hydrant.engine.block_table import BlockTable
from hydrant.engine.outputs import FinishReason
from hydrant.engine.protocol import AdapterRef
from hydrant.engine.sampler import SamplingRow, TokenLogprob, make_generator
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.structured_output import Guide

if TYPE_CHECKING:
    from hydrant.engine.lora_adapter import LoraAdapter

Lane = str  # "short" or "long"
SHORT_LANE: Lane = "short"
LONG_LANE: Lane = "long"

_seq_ids = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestTimes:
    """Wall-clock times (time.time()) and the device time a request consumed."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finish_time: float | None = None
    device_seconds: float = 0.0
    cached_tokens: int = 0

    @classmethod
    def arriving(cls) -> RequestTimes:
        """Times of a request arriving now."""
        return cls(time.time())


@dataclass(eq=False)
class Request:
    """One client request: its prompt, sampling settings, tenant and its sequences.

    The caller gives the fields up to `times`; it is checked once, read-only
    (`RequestValidator`), before it is queued. The rest is the engine's:
    `lane` and `cache_salt` follow from its config and adapter (`Scheduler.add_request`
    sets them), the others record the request's progress.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    tenant_id: str = "default"
    tenant_weight: float = 1.0
    priority: int = 0
    times: RequestTimes = field(default_factory=RequestTimes.arriving)
    adapter: AdapterRef | None = None  # the LoRA adapter it runs with; None: the base model
    lane: Lane = field(default=SHORT_LANE, init=False)
    cache_salt: bytes = field(default=b"", init=False)
    seqs: list[Sequence] = field(default_factory=list, init=False)
    forked: bool = field(default=False, init=False)
    num_preemptions: int = field(default=0, init=False)
    # With `params.prompt_logprobs`: entry i scores prompt token i (None for token 0).
    prompt_logprobs: list[TokenLogprob | None] | None = field(default=None, init=False)
    prompt_logprobs_sent: bool = field(default=False, init=False)
    # With `params.embed`, once the prompt is computed.
    embedding: list[float] | None = field(default=None, init=False)
    # The adapter's load from disk (engine/lora_manager.py): it waits until this is done.
    adapter_load: Future[LoraAdapter] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    def record_prompt_logprobs(self, first: int, entries: list[TokenLogprob]) -> None:
        """Scores of prompt tokens `first`, `first + 1`, ...; those already held (a
        preempted prompt computed again) are not added twice."""
        held = self.prompt_logprobs
        if held is None:
            return
        for index, entry in enumerate(entries, start=first):
            if index == len(held):
                held.append(entry)

    @property
    def finished(self) -> bool:
        return all(seq.status is SequenceStatus.FINISHED for seq in self.seqs)

    def completion_tokens(self) -> int:
        return sum(len(seq.output_token_ids) for seq in self.seqs)

    def fork_choices(self, first: Sequence, device: torch.device) -> list[Sequence]:
        """The other `n - 1` choices, once `first` has computed the prompt (once a request).

        Choice `i` of a seeded request draws with `seed + i`, so the choices differ
        and stay reproducible. The scheduler shares the blocks (`Scheduler.add_forked`).
        """
        if self.params.n == 1 or self.forked:
            return []
        self.forked = True
        seed = self.params.seed
        children = [
            first.fork(index, make_generator(None if seed is None else seed + index, device))
            for index in range(1, self.params.n)
        ]
        self.seqs.extend(children)
        return children


class Sequence:
    """One choice of a request: its tokens, its KV blocks and where computing stands."""

    def __init__(self, request: Request, index: int, generator: torch.Generator | None) -> None:
        self.seq_id = next(_seq_ids)
        self.request = request
        self.index = index
        self.prompt_token_ids = request.prompt_token_ids
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.block_table: list[int] = BlockTable()
        self.block_hashes: list[bytes] = []  # chained hashes of its full blocks, in order
        self.num_committed_blocks = 0  # full blocks already offered to the prefix cache
        self.status = SequenceStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.generator = generator
        self.guide: Guide | None = None  # its JSON-schema parser state (structured output)
        # The token the guide waits for (a thinking model's `</think>`); None: it is on.
        self.guide_waits_for: int | None = None
        # Mean / CLS pooling: the prompt's pooled hidden states so far (its chunks add up).
        self.pool_sum: torch.Tensor | None = None
        # The device slot of its adapter while it runs (pinned); -1: none or not running.
        self.lora_slot = -1

    def sampling_row(self) -> SamplingRow:
        """What the sampler needs of this sequence for its next token."""
        return SamplingRow(
            self.request.params,
            self.prompt_token_ids,
            self.output_token_ids,
            self.generator,
            self.active_guide,
        )

    @property
    def active_guide(self) -> Guide | None:
        """The guide that masks the next token: none while it waits for its token."""
        return self.guide if self.guide_waits_for is None else None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def lane(self) -> Lane:
        return self.request.lane

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids [start, end) across the prompt/output boundary, without copying both."""
        n_prompt = len(self.prompt_token_ids)
        if end <= n_prompt:
            return self.prompt_token_ids[start:end]
        if start >= n_prompt:
            return self.output_token_ids[start - n_prompt : end - n_prompt]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n_prompt]

    def full_block_hashes(self, block_size: int) -> list[bytes]:
        """Chained hashes of every full block of the current tokens (extends the memo).

        sha256 over (parent hash, token ids): a prefix-cache hit hands one
        tenant's K/V to another request, so a forgeable hash would be a leak.
        """
        full = self.num_tokens // block_size
        while len(self.block_hashes) < full:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else self.request.cache_salt
            ids = self.tokens(i * block_size, (i + 1) * block_size)
            digest = hashlib.sha256(parent)
            digest.update(struct.pack(f"<{len(ids)}q", *ids))
            self.block_hashes.append(digest.digest())
        return self.block_hashes

    def fork(self, index: int, generator: torch.Generator | None) -> Sequence:
        """A sibling with the same tokens and computed state; blocks are shared by the caller."""
        child = Sequence(self.request, index, generator)
        child.output_token_ids = list(self.output_token_ids)
        child.num_computed_tokens = self.num_computed_tokens
        child.block_table = BlockTable(self.block_table)
        child.block_hashes = list(self.block_hashes)
        child.num_committed_blocks = self.num_committed_blocks
        child.status = self.status
        child.guide = self.guide.fork() if self.guide is not None else None
        child.guide_waits_for = self.guide_waits_for
        return child

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: drop all K/V; prompt and outputs are re-prefilled later."""
        self.num_computed_tokens = 0
        self.block_table = BlockTable()
        self.num_committed_blocks = 0
        self.status = SequenceStatus.WAITING

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request.request_id}#{self.index}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, {self.status.value})"
        )
