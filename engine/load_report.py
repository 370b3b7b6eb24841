"""Where a model load (or a wake) spends its time, phase by phase.

Cold start is what a scale-from-zero request waits for, so it is measured in
the pieces an operator can act on: tokenizer, building the module on `meta`,
reading the weights, quantizing, allocating the KV cache, profiling on CUDA.
The phases are recorded into the report of the load in progress (a context
variable), so the loader and the quantizer deep down need no extra parameter
threaded through every layer in between.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

_current: contextvars.ContextVar[LoadReport | None] = contextvars.ContextVar(
    "hydrant_load_report", default=None
)


@dataclass
class LoadReport:
    """Seconds per phase, in the order the phases ran (a repeated phase adds up)."""

    kind: str = "load"  # "load" or "wake"
    phases: dict[str, float] = field(default_factory=dict)
    wall_seconds: float | None = None  # start to end, untimed gaps (quantizing) included
    threads: int | None = None  # torch intra-op threads the engine runs with (a load's)

    @property
    def total_seconds(self) -> float:
        return self.wall_seconds if self.wall_seconds is not None else sum(self.phases.values())

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    @contextlib.contextmanager
    def active(self) -> Iterator[LoadReport]:
        """Make this the report that `timed_phase` records into, for the block's duration."""
        token = _current.set(self)
        try:
            yield self
        finally:
            _current.reset(token)

    def as_dict(self) -> dict[str, float]:
        """Phase -> seconds, rounded to the microsecond, plus "total" (for stats and logs)."""
        out = {name: round(seconds, 6) for name, seconds in self.phases.items()}
        out["total"] = round(self.total_seconds, 6)
        return out

    def log(self, logger: logging.Logger, what: str) -> None:
        """One structured record; each phase is a flat numeric extra field (`phase_weights_s`),
        so JSON logs stay queryable; never a path or a secret."""
        parts = ", ".join(f"{name} {seconds:.3f}s" for name, seconds in self.phases.items())
        threads = f", {self.threads} torch threads" if self.threads is not None else ""
        logger.info(
            "%s %s in %.3fs (%s)%s",
            what,
            self.kind,
            self.total_seconds,
            parts,
            threads,
            extra={
                "event": f"engine_{self.kind}",
                **{f"phase_{name}_s": value for name, value in self.as_dict().items()},
                **({"torch_threads": self.threads} if self.threads is not None else {}),
            },
        )


@contextlib.contextmanager
def timed_phase(name: str) -> Iterator[None]:
    """Time the block into the active report, if a load is being reported (else a no-op)."""
    report = _current.get()
    if report is None:
        yield
        return
    with report.phase(name):
        yield
