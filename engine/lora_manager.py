"""Adapters from disk to a device slot, without stalling the step loop.

`AdapterLoader` reads an adapter on its first use on a thread of that load's own (one
slow or hung read, say of a stalled network mount, then holds up no other adapter's first
load, and as a daemon thread it cannot hold up the process's exit), then keeps it in a
bounded host LRU (`max_cpu_loras`) so a later request, or one evicted from its device
slot, needs no disk read. `AdapterManager` is what the scheduler asks: a waiting
sequence whose adapter is still loading (or whose slots are all pinned) is skipped,
others keep stepping, and it is admitted in the first step after its weights are on
the host and a slot is free. A load that fails ends only its own requests.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import OrderedDict
from concurrent.futures import Future

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.lora_adapter import LoraAdapter, load_adapter
from hydrant.engine.lora_slots import LoraSlots
from hydrant.engine.protocol import AdapterRef
from hydrant.engine.sequence import Request, Sequence


class AdapterLoader:
    """Disk to host memory, each load on a thread of its own; a bounded LRU of loaded
    adapters."""

    def __init__(
        self, config: ModelConfig, max_cpu_loras: int, max_rank: int, dtype: torch.dtype
    ) -> None:
        self.config = config
        self.max_cpu_loras = max_cpu_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self._lock = threading.Lock()  # the step thread and the async front both ask
        self._host: OrderedDict[str, LoraAdapter] = OrderedDict()
        self._loading: dict[str, Future[LoraAdapter]] = {}

    def load(self, ref: AdapterRef) -> Future[LoraAdapter]:
        """The adapter `ref` names (its name and directory, `ref.key`): done at once when
        held, else its load, shared by every request that asks meanwhile."""
        key = ref.key
        with self._lock:
            held = self._host.get(key)
            if held is not None:
                self._host.move_to_end(key)
                done: Future[LoraAdapter] = Future()
                done.set_result(held)
                return done
            future = self._loading.get(key)
            if future is None:
                future = Future()
                # Running from now on: a waiter that gives up (a client leaving, which
                # cancels its asyncio wrapper) cannot cancel a load others share.
                future.set_running_or_notify_cancel()
                self._loading[key] = future
                thread = threading.Thread(
                    target=self._read, args=(ref, future), name="hydrant-lora", daemon=True
                )
                try:
                    thread.start()
                except RuntimeError as exc:  # no thread to be had: this load fails, not hangs
                    del self._loading[key]
                    future.set_exception(exc)
            return future

    def _read(self, ref: AdapterRef, future: Future[LoraAdapter]) -> None:
        try:
            adapter = load_adapter(ref.name, ref.path, self.config, self.max_rank, self.dtype)
        except BaseException as exc:
            with self._lock:
                self._loading.pop(ref.key, None)
            future.set_exception(exc)
            return
        with self._lock:
            self._loading.pop(ref.key, None)
            for key in [k for k, held in self._host.items() if held.name == ref.name]:
                del self._host[key]  # an older version: the gateway sends only the newest
            self._host[ref.key] = adapter
            while len(self._host) > self.max_cpu_loras:
                self._host.popitem(last=False)
        future.set_result(adapter)

    @property
    def names(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(dict.fromkeys(held.name for held in self._host.values()))


class AdapterManager:
    """The scheduler's view: is a sequence's adapter resident, which slot, when to unpin."""

    def __init__(self, loader: AdapterLoader, slots: LoraSlots) -> None:
        self.loader = loader
        self.slots = slots
        self._loading: dict[str, Request] = {}  # requests whose adapter is not read yet

    def submit(self, request: Request) -> None:
        """Start (or join) the load of the request's adapter; it waits in the queue."""
        if request.adapter is None:
            return
        request.adapter_load = self.loader.load(request.adapter)
        if not request.adapter_load.done():
            self._loading[request.request_id] = request

    def acquire(self, seq: Sequence) -> bool:
        """Pin a slot for a sequence about to run; False while its adapter is not loaded or
        every slot is pinned (it stays waiting). True at once for the base model."""
        future = seq.request.adapter_load
        if future is None or seq.lora_slot >= 0:
            return True
        if not future.done() or future.exception() is not None:
            return False
        slot = self.slots.acquire(future.result())
        if slot is None:
            return False
        seq.lora_slot = slot
        return True

    def release(self, seq: Sequence) -> None:
        """The sequence stopped running (finished or preempted): unpin its slot."""
        if seq.lora_slot >= 0:
            self.slots.release(seq.lora_slot)
            seq.lora_slot = -1

    def share(self, parent: Sequence, child: Sequence) -> None:
        """A forked choice runs with its parent's slot."""
        if parent.lora_slot >= 0:
            self.slots.pin(parent.lora_slot)
            child.lora_slot = parent.lora_slot

    def failed(self) -> list[tuple[Request, BaseException]]:
        """Requests whose adapter could not be loaded (each reported once)."""
        failures = []
        for request_id, request in list(self._loading.items()):
            future = request.adapter_load
            if future is None or not future.done():
                continue
            del self._loading[request_id]
            error = future.exception()
            if error is not None:
                failures.append((request, error))
        return failures

    def wait_for_loads(self, timeout: float) -> None:
        """Block up to `timeout` for a pending load (a step with nothing else to run)."""
        pending = [r.adapter_load for r in self._loading.values() if r.adapter_load is not None]
        if pending:
            concurrent.futures.wait(pending, timeout, concurrent.futures.FIRST_COMPLETED)

    def forget(self, request: Request) -> None:
        self._loading.pop(request.request_id, None)

    @property
    def names(self) -> tuple[str, ...]:
        """Adapters this engine holds (device slots first), for dispatch preference."""
        resident = self.slots.resident
        return resident + tuple(n for n in self.loader.names if n not in resident)
