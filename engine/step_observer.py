"""Feeds the Prometheus metrics from the engine's state after each step.

The block manager and scheduler keep cumulative counters (prefix-cache
lookups, preemptions); Prometheus counters want increments, so this keeps
what was already reported and sends the difference.
"""

from __future__ import annotations

from hydrant.engine.metrics import EngineMetrics
from hydrant.engine.scheduler import Scheduler, SchedulerOutput


class StepObserver:
    def __init__(self, metrics: EngineMetrics | None, scheduler: Scheduler) -> None:
        self.metrics = metrics
        self.scheduler = scheduler
        self._prefix_seen = (0, 0)
        self._preemptions_seen = 0

    def observe(self, sched: SchedulerOutput, num_generated: int = 0) -> None:
        """Report one step: gauges of the state after it, and the counters' increments."""
        metrics = self.metrics
        if metrics is None:
            return
        bm = self.scheduler.block_manager
        metrics.observe_step(
            len(self.scheduler.running),
            len(self.scheduler.waiting),
            bm.usage,
            sched.num_batched_tokens,
        )
        queries, hits = bm.prefix_queries, bm.prefix_hits
        if (queries, hits) != self._prefix_seen:
            metrics.record_prefix_cache(queries - self._prefix_seen[0], hits - self._prefix_seen[1])
            self._prefix_seen = (queries, hits)
        preemptions = self.scheduler.num_preemptions
        if preemptions != self._preemptions_seen:
            metrics.record_preemption(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions
        prompt_tokens = sum(
            max(0, min(i.start + i.num_new_tokens, len(i.seq.prompt_token_ids)) - i.start)
            for i in sched.scheduled
        )
        metrics.record_tokens(prompt_tokens, num_generated)
