"""How a pool gets more or fewer workers: one `Scaler` interface, one implementation per place.

`LocalProcessScaler` spawns `hydrant worker` processes on this machine (the
default with Redis); `KubernetesScaler` (kubernetes.py) sets a Deployment's
replicas, for clusters without KEDA. The pool decides *when* to scale (a
request at zero, an idle timeout, a swap); the scaler only makes it so.
Workers announce themselves in the registry; a scaler never reports
readiness, the registry does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolSpec:
    """What a pool's workers run: the model name, its checkpoint and quantization."""

    model: str
    path: str
    quantization: str | None = None

    @property
    def revision(self) -> tuple[str, str | None]:
        return (self.path, self.quantization)


class Scaler(Protocol):
    #: True when the platform underneath replaces workers itself on `update` (a rolling
    #: Deployment update); False when the pool starts the new ones and drains the old.
    rolls_itself: bool

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        """Have `replicas` workers of `spec` (starting or stopping some); returns at once."""
        ...

    async def update(self, spec: PoolSpec) -> None:
        """Make new workers of the pool run `spec` (only where `rolls_itself`)."""
        ...

    async def retire(self, keep: PoolSpec) -> None:
        """The pool drained its workers of every spec but `keep`: stop counting them.

        Without this a drained worker still finishing its last requests would count
        as a running worker of its spec, and swapping back to that spec (a rollback)
        would start none.
        """
        ...

    async def close(self) -> None: ...


class NoScaler:
    """Workers are started by someone else (systemd, an operator); pools only sleep and wake."""

    rolls_itself = False

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        log.info("no scaler configured", extra={"model": spec.model, "replicas": replicas})

    async def update(self, spec: PoolSpec) -> None:
        return None

    async def retire(self, keep: PoolSpec) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class _Child:
    spec: PoolSpec
    process: subprocess.Popen[bytes]
    log_path: Path | None  # None: it writes to the gateway's own stderr
    stopping: bool = False
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class LocalProcessScaler:
    """Spawns and stops `hydrant worker` processes on this machine.

    Children get their settings explicitly (Redis, secret, registry prefix,
    heartbeat), not by inheriting whatever the gateway was started with, and
    run in their own session so a Ctrl-C at the gateway's terminal does not
    kill them mid-drain: the gateway stops them with SIGTERM on shutdown.
    `log_dir` None: the children write to the gateway's stderr (the embedded
    default, whose one serve log shows its engine loading).
    """

    env: dict[str, str]
    log_dir: Path | None
    device: str = "cpu"
    stop_timeout_s: float = 60.0
    rolls_itself = False
    _children: list[_Child] = field(default_factory=list)
    _seq: int = 0
    #: With `track_deaths`: children that exited unasked (a crash, a kill), kept until a
    #: supervisor takes them (dispatch.embedded); pools learn of deaths from the registry.
    track_deaths: bool = False
    died: list[_Child] = field(default_factory=list)

    def reap(self) -> list[_Child]:
        """Forget exited children; those that exited unasked are logged and returned."""
        exited = [c for c in self._children if c.process.poll() is not None]
        if exited:
            self._children = [c for c in self._children if c not in exited]
        for child in exited:
            if not child.stopping:
                log.warning(
                    "worker process exited",
                    extra={
                        "model": child.spec.model,
                        "pid": child.process.pid,
                        "exit_code": child.process.returncode,
                    },
                )
        unasked = [c for c in exited if not c.stopping]
        if self.track_deaths:
            self.died.extend(unasked)
        return unasked

    def running(self, spec: PoolSpec | None = None, model: str | None = None) -> list[_Child]:
        self.reap()
        return [
            c
            for c in self._children
            if not c.stopping
            and (spec is None or c.spec == spec)
            and (model is None or c.spec.model == model)
        ]

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        current = self.running(spec) if replicas > 0 else self.running(model=spec.model)
        for _ in range(replicas - len(current)):
            self._spawn(spec)
        if replicas < len(current):
            for child in current[replicas:]:
                self._terminate(child)

    async def update(self, spec: PoolSpec) -> None:
        return None

    async def retire(self, keep: PoolSpec) -> None:
        # SIGTERM starts the same drain the pool asked for over HTTP (a no-op twice),
        # and marks the child stopping so `running()` no longer counts it.
        for child in self.running(model=keep.model):
            if child.spec != keep:
                self._terminate(child)

    def _spawn(self, spec: PoolSpec) -> None:
        self._seq += 1
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"worker-{spec.model}-{os.getpid()}-{self._seq}.log"
        command = [
            sys.executable,
            "-m",
            "hydrant.cli",
            "worker",
            "--model",
            spec.model,
            "--path",
            spec.path,
            "--device",
            self.device,
            "--port",
            "0",
        ]
        if spec.quantization:
            command += ["--quantization", spec.quantization]
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(log_path, "ab")) if log_path is not None else None
            process = subprocess.Popen(  # noqa: S603  # our own executable and arguments
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self._children.append(_Child(spec, process, log_path))
        log.info("worker process started", extra={"model": spec.model, "pid": process.pid})

    def _terminate(self, child: _Child) -> None:
        child.stopping = True
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)  # the worker drains, then exits
            log.info("worker process stopping", extra={"pid": child.process.pid})

    async def close(self) -> None:
        children = [c for c in self._children if c.process.poll() is None]
        for child in children:
            self._terminate(child)
        for child in children:
            try:
                await asyncio.to_thread(child.process.wait, self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                child.process.kill()
                await asyncio.to_thread(child.process.wait)
        self._children.clear()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM (a drain) when the gateway dies, even by SIGKILL.

    The children run in their own session (a Ctrl-C at the gateway's terminal
    must not cut their drain), so nothing else would stop them: an orphaned
    worker would keep heartbeating into a pool nobody serves.
    """
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def local_worker_env(base: dict[str, str], values: dict[str, str | None]) -> dict[str, str]:
    """The environment of a spawned worker: the gateway's, minus its log file, plus `values`."""
    env = {k: v for k, v in base.items() if k not in ("HYDRANT_LOG_FILE", "HYDRANT_PORT")}
    env.update({k: v for k, v in values.items() if v is not None})
    return env
