"""Iteration-level scheduling: which sequences compute how many tokens this step.

Every step the scheduler first continues the running sequences (decodes
before prefill chunks), then admits waiting ones while the token budget, the
sequence limit and the KV pool allow. A prompt larger than what is left of
the budget is prefilled in chunks over several steps, mixed with decodes; in
a step with decodes, prompt chunks share a smaller cap
(`max_prefill_tokens_while_decoding`, token_budget.py) so they do not stall
every running stream's next token.

Order everywhere is (priority, tenant's virtual token counter, arrival):
urgent requests first, then the least-served tenant. When a running
sequence needs a block and none is free, the sequence last in that order is
preempted (its blocks freed, to be recomputed later), possibly the one asking.

Background requests (priority `BACKGROUND_PRIORITY` or more: batch lines) are paused,
keeping their blocks, in every step where a foreground request runs or is admitted:
each extra sequence lengthens a step, and a foreground request must not wait on
background work. A foreground request that arrives while only background work runs
starts in a step of its own (the background decodes wait that one step), and a step of
background work computes at most `max_background_step_tokens` (its prompts chunked),
so an arriving request waits on at most one short step (issue #27). A foreground
request waiting for blocks does not pause them (they finish and free their blocks); a
running one that needs a block preempts them first.

The scheduler owns the block manager: every allocation, fork, free and
prefix-cache reset goes through it, so the engine never touches blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from hydrant.engine.block_manager import BlockManager
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.fairness import VirtualTokenCounter
from hydrant.engine.lora_manager import AdapterManager
from hydrant.engine.outputs import FinishReason
from hydrant.engine.protocol import BACKGROUND_PRIORITY, EngineStats
from hydrant.engine.sequence import LONG_LANE, SHORT_LANE, Request, Sequence, SequenceStatus
from hydrant.engine.token_budget import TokenBudget


@dataclass
class ScheduledSeq:
    """A sequence computing `num_new_tokens` tokens from `start` in this step."""

    seq: Sequence
    start: int
    num_new_tokens: int

    @property
    def completes(self) -> bool:
        """Whether this chunk reaches the end of the sequence, so a token is sampled."""
        return self.start + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def charge_device_time(self, seconds: float) -> None:
        """Split the step's duration over its sequences' requests by the tokens each computed."""
        total = self.num_batched_tokens
        for item in self.scheduled:
            item.seq.request.times.device_seconds += seconds * item.num_new_tokens / total


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        pool_every_token: bool = False,
        adapters: AdapterManager | None = None,
    ) -> None:
        self.config = config
        self.block_manager = BlockManager(
            num_blocks, config.block_size, config.enable_prefix_caching
        )
        # Mean / CLS pooling reads hidden states of the whole prompt: an embed request then
        # computes it all, since cached blocks hold K/V, not hidden states.
        self.pool_every_token = pool_every_token
        # LoRA slots: a sequence pins its adapter's slot while it runs (lora_manager.py)
        self.adapters = adapters
        self.fairness = VirtualTokenCounter()
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._watermark = max(1, num_blocks // 100)

    # ---- bookkeeping --------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a checked request's sequences, in the lane and prefix-cache scope its
        prompt and tenant give it."""
        long = len(request.prompt_token_ids) >= self.config.long_prompt_threshold
        request.lane = LONG_LANE if long else SHORT_LANE
        salt = request.tenant_id.encode() if self.config.prefix_cache_per_tenant else b""
        if request.adapter is not None:  # an adapter's K/V is not the base model's
            salt += b"\x00adapter:" + request.adapter.key.encode()
        request.cache_salt = b"hydrant-prefix:" + salt
        self.fairness.arrive(request.tenant_id)
        self.waiting.extend(request.seqs)

    def fork_new_choices(
        self, sampled: list[Sequence], device: torch.device
    ) -> tuple[list[Sequence], list[int]]:
        """Fork every `n > 1` request whose prompt was just computed; returns each
        sequence to sample (new choices after their first) and the index in `sampled`
        of the logits row it draws from. New choices run from now on and share every
        block of their first."""
        seqs: list[Sequence] = []
        rows: list[int] = []
        for row, seq in enumerate(sampled):
            seqs.append(seq)
            rows.append(row)
            children = seq.request.fork_choices(seq, device)
            for child in children:
                self.block_manager.fork(seq, child)
                if self.adapters is not None:
                    self.adapters.share(seq, child)
                self.running.append(child)
                seqs.append(child)
                rows.append(row)
        return seqs, rows

    def finish_seq(self, seq: Sequence, reason: FinishReason) -> None:
        """Mark finished and free its blocks at once; departs the tenant with the request."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._unpin(seq)
        else:
            self.waiting.remove(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.free(seq)
        if seq.request.finished:
            self.fairness.depart(seq.request.tenant_id)

    def finish_request(self, request: Request, reason: FinishReason) -> None:
        """End every unfinished sequence of the request (an abort, a failed step)."""
        for seq in request.seqs:
            self.finish_seq(seq, reason)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix: the KV tensors are freed or were just re-allocated."""
        self.block_manager.reset_prefix_cache()

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=bm.usage,
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            prefix_cache_hit_rate=bm.prefix_hits / bm.prefix_queries if bm.prefix_queries else 0.0,
            loaded_adapters=self.adapters.names if self.adapters is not None else (),
        )

    def _key(self, seq: Sequence) -> tuple[int, float, float, int]:
        req = seq.request
        return (
            req.priority,
            self.fairness.counter(req.tenant_id),
            req.times.arrival_time,
            seq.seq_id,
        )

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        self._unpin(seq)  # it keeps its adapter; it pins a slot again when readmitted
        seq.reset_for_recompute()
        self.waiting.append(seq)
        self.num_preemptions += 1
        seq.request.num_preemptions += 1
        out.preempted.append(seq)

    # ---- the step -----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        foreground = any(not _background(s) for s in self.running)
        if not foreground and any(not _background(s) for s in self.waiting):
            # Only background work runs and a foreground request waits: it starts alone if
            # it can; if it cannot (no blocks yet), the background work goes on.
            self._schedule_waiting(self._budget(True), out, pause_background=True)
            foreground = not out.is_empty
        if out.is_empty:
            budget = self._budget(foreground)
            self._schedule_running(budget, out, foreground)
            if not out.preempted:
                self._schedule_waiting(budget, out, foreground)
        out.block_copies = self.block_manager.pop_copies()
        for item in out.scheduled:
            req = item.seq.request
            self.fairness.charge(req.tenant_id, item.num_new_tokens, req.tenant_weight)
        return out

    def _budget(self, foreground: bool) -> TokenBudget:
        """The step's token budget; the lanes' demand leaves out paused background work,
        and so does the queue the prefill cap scales with (decoding against prefilling)."""
        long_demand = short_prefill_demand = decoding = prefilling = 0
        for s in (*self.running, *self.waiting):
            if foreground and _background(s):
                continue
            left = s.num_uncomputed
            if s.lane == LONG_LANE:
                long_demand += left
            elif left > 1:
                short_prefill_demand += left
            if left > 1:
                prefilling += 1
            elif left == 1 and s.output_token_ids:
                decoding += 1
        return TokenBudget(
            self.config,
            long_demand,
            short_prefill_demand,
            self.config.max_background_step_tokens,
            queue=(decoding, prefilling),
        )

    def _schedule_running(
        self, budget: TokenBudget, out: SchedulerOutput, pause_background: bool
    ) -> None:
        pending = sorted(self.running, key=lambda s: (s.num_uncomputed > 1, self._key(s)))
        pending.reverse()  # pop() from the end takes the most deserving first
        paused: list[Sequence] = []  # background ones not computed this step
        while pending:
            seq = pending.pop()
            if pause_background and _background(seq):
                paused.append(seq)  # still the first preemption victims of the others
                continue
            prefill = seq.num_uncomputed > 1  # the rest of a chunked prompt
            background = _background(seq)
            wanted = budget.grant(
                seq.lane, seq.num_uncomputed, prefill=prefill, background=background
            )
            if wanted == 0:
                continue
            start = seq.num_computed_tokens
            while not self.block_manager.allocate_slots(seq, wanted):
                candidates = pending + paused
                victim = max(candidates, key=self._key) if candidates else seq
                if victim is seq:
                    budget.refund(seq.lane, wanted, prefill=prefill, background=background)
                    self._preempt(seq, out)
                    break
                (paused if victim in paused else pending).remove(victim)
                self._preempt(victim, out)
            else:
                out.scheduled.append(ScheduledSeq(seq, start, wanted))

    def _schedule_waiting(
        self, budget: TokenBudget, out: SchedulerOutput, pause_background: bool
    ) -> None:
        admitted: list[Sequence] = []
        for seq in sorted(self.waiting, key=self._key):  # background ones come last
            if len(self.running) + len(admitted) >= self.config.max_num_seqs:
                break
            if budget.total_left == 0 or budget.prefill_exhausted:
                break
            if budget.lane_left(seq.lane) == 0:
                continue
            background = _background(seq)
            if background and (pause_background or budget.background_left == 0):
                break  # every one left is background: they wait for an idle step, or the next
            # a prompt to score is computed in full: cached blocks have no logits to give
            params = seq.request.params
            whole = params.prompt_logprobs is not None or (params.embed and self.pool_every_token)
            cached = [] if whole else self.block_manager.find_cached_prefix(seq)
            remaining = seq.num_tokens - len(cached) * self.block_manager.block_size
            wanted = budget.grant(seq.lane, remaining, prefill=True, background=background)
            if wanted == 0:
                continue
            if self.adapters is not None and not self.adapters.acquire(seq):
                budget.refund(seq.lane, wanted, prefill=True, background=background)
                continue  # its adapter is loading or every slot is busy: others go on
            # the watermark keeps room for running decodes; an idle engine needs none
            reserve = self._watermark if self.running or admitted else 0
            if not self.block_manager.allocate_slots(seq, wanted, cached, reserve):
                budget.refund(seq.lane, wanted, prefill=True, background=background)
                self._unpin(seq)
                break  # keep the order: a later, smaller request must not jump it forever
            self.block_manager.record_lookup(seq.num_tokens, seq.num_computed_tokens)
            req = seq.request
            if req.times.first_scheduled_time is None:
                req.times.first_scheduled_time = time.time()
                req.times.cached_tokens = seq.num_computed_tokens
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, wanted))
            admitted.append(seq)
            pause_background = pause_background or not background
        for seq in admitted:
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def _unpin(self, seq: Sequence) -> None:
        if self.adapters is not None:
            self.adapters.release(seq)

    def on_step_done(self, out: SchedulerOutput) -> None:
        """The forward ran: the scheduled tokens now have K/V; offer full blocks to the cache."""
        for item in out.scheduled:
            seq = item.seq
            seq.num_computed_tokens = item.start + item.num_new_tokens
            self.block_manager.commit_full_blocks(seq)


def _background(seq: Sequence) -> bool:
    return seq.request.priority >= BACKGROUND_PRIORITY
