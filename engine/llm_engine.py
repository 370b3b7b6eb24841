"""The synchronous engine: add requests, call `step()`, read typed outputs.

A request is one `Request` object from the caller (the async front, a test)
to the scheduler, checked once by the `RequestValidator`. A step reads as
schedule -> run -> postprocess: the scheduler picks the chunks (it owns the
KV blocks), the model runner computes them in one forward, the sampler picks
one token for every sequence that reached its end (a just-prefilled `n > 1`
request forks first), and the output processor applies structured-output
guides and stop rules. Finished sequences free their blocks in the same step.

Not thread-safe: one thread drives it. The async front (async_engine.py)
funnels every call onto that thread.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Protocol

import torch

from hydrant.engine.config import ModelConfig
from hydrant.engine.engine_config import (
    EngineConfig,
    EngineConfigError,
    apply_num_threads,
    is_cpu_device,
)
from hydrant.engine.errors import EngineError, InvalidRequestError
from hydrant.engine.load_report import LoadReport, timed_phase
from hydrant.engine.loader import read_model_config
from hydrant.engine.lora_manager import AdapterLoader, AdapterManager
from hydrant.engine.metrics import EngineMetrics
from hydrant.engine.model_runner import ModelOutput, ModelRunner
from hydrant.engine.output_processor import OutputProcessor, StepSample
from hydrant.engine.outputs import FinishReason, RequestOutput
from hydrant.engine.protocol import EngineStats
from hydrant.engine.sampler import Sampler, make_generator
from hydrant.engine.scheduler import Scheduler, SchedulerOutput
from hydrant.engine.sequence import Request, Sequence
from hydrant.engine.sleep_mode import EngineBusyError, EngineSleepingError
from hydrant.engine.step_observer import StepObserver
from hydrant.engine.tokenizer import Tokenizer
from hydrant.engine.validation import RequestValidator

logger = logging.getLogger(__name__)

ADAPTER_WAIT_S = 0.05  # a step with only adapter loads pending waits this long for one


class Runner(Protocol):
    """What the engine needs of a model runner (tests substitute a fake)."""

    num_blocks: int
    device: torch.device

    def execute(self, out: SchedulerOutput) -> ModelOutput: ...


class SleepableRunner(Runner, Protocol):
    """A runner that can give its device memory back (the real `ModelRunner`)."""

    sleeping: bool

    def sleep(self) -> None: ...

    def wake(self) -> None: ...


class LLMEngine:
    def __init__(
        self,
        runner: Runner,
        config: EngineConfig,
        model_config: ModelConfig,
        max_model_len: int,
        tokenizer: Tokenizer | None = None,
        metrics: EngineMetrics | None = None,
    ) -> None:
        self.runner = runner
        self.config = config
        self.model_config = model_config
        self.max_model_len = max_model_len
        self.tokenizer = tokenizer
        self.metrics = metrics
        eos = tokenizer.eos_token_ids if tokenizer is not None else model_config.eos_token_ids
        self.adapters: AdapterManager | None = None
        slots = getattr(runner, "lora_slots", None)  # a runner that can serve LoRA adapters
        if slots is not None:
            loader = AdapterLoader(
                model_config, config.max_cpu_loras, config.max_lora_rank, slots.dtype
            )
            self.adapters = AdapterManager(loader, slots)
        self.scheduler = Scheduler(
            config,
            runner.num_blocks,
            pool_every_token=model_config.pooling != "last",
            adapters=self.adapters,
        )
        self.sampler = Sampler(eos)
        self.validator = RequestValidator.for_model(
            model_config, max_model_len, tokenizer is not None
        )
        self.processor = OutputProcessor(tokenizer, eos, max_model_len, model_config.vocab_size)
        self._requests: dict[str, Request] = {}
        self._pending: list[RequestOutput] = []  # aborted requests' last outputs
        self._observer = StepObserver(metrics, self.scheduler)
        self.total_device_seconds = 0.0  # sum of measured step durations
        self.load_report: LoadReport | None = None  # set by from_pretrained
        self.wake_report: LoadReport | None = None  # the last wake's phases

    @classmethod
    def from_pretrained(
        cls, model_dir: Path, config: EngineConfig, metrics: EngineMetrics | None = None
    ) -> LLMEngine:
        """Load config, weights and (when the directory has one) the tokenizer.

        Each phase is timed into `engine.load_report` and logged as one record, with
        the torch thread count `config.num_threads` resolved to (set here, once the
        model's size is read and before the weights load: the one place every engine,
        worker or embedded, is built; `auto` depends on the size).
        """
        report = LoadReport("load")
        started = time.perf_counter()
        with report.active():
            with timed_phase("config"):
                model_config = read_model_config(Path(model_dir))
            # Only a CPU engine computes on these threads: a GPU one keeps a core for its front.
            size = model_config.linear_params if is_cpu_device(config.device) else None
            report.threads = apply_num_threads(config.num_threads, size)
            engine = cls._load(Path(model_dir), model_config, config, metrics)
        report.wall_seconds = time.perf_counter() - started
        engine.load_report = report
        report.log(logger, "model")
        return engine

    @classmethod
    def _load(
        cls,
        model_dir: Path,
        model_config: ModelConfig,
        config: EngineConfig,
        metrics: EngineMetrics | None,
    ) -> LLMEngine:
        max_model_len = model_config.max_model_len
        if config.max_model_len is not None:
            if config.max_model_len > max_model_len:
                raise EngineConfigError(
                    f"max_model_len={config.max_model_len} exceeds the model's {max_model_len}"
                )
            max_model_len = config.max_model_len
        tokenizer = None
        if (model_dir / "tokenizer.json").is_file():
            with timed_phase("tokenizer"):
                tokenizer = Tokenizer.from_pretrained(model_dir)
        else:
            logger.warning("no tokenizer.json in %s: outputs carry token ids only", model_dir)
        runner = ModelRunner.from_pretrained(model_dir, model_config, config, max_model_len)
        return cls(runner, config, model_config, max_model_len, tokenizer, metrics)

    # ---- requests -----------------------------------------------------------------------

    def add_request(self, request: Request, *, checked: bool = False) -> None:
        """Queue `request`, the same object from here to the scheduler; its outputs come
        from `step()`. It is checked by `validator` first unless `checked` says that was
        done already (the async front checks on its event loop, before queueing it)."""
        self._check_awake()
        if request.request_id in self._requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already running", None)
        if not checked:
            self.validator.check(request)
        if request.adapter is not None:
            if self.adapters is None:
                raise InvalidRequestError("this engine serves no LoRA adapters", "model")
            self.adapters.submit(request)  # read off this thread; it waits until loaded
        seq = Sequence(request, 0, make_generator(request.params.seed, self.runner.device))
        self.processor.attach_guide(seq)
        request.seqs.append(seq)
        self._requests[request.request_id] = request
        self.scheduler.add_request(request)

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks; its last output comes with the next step."""
        request = self._requests.get(request_id)
        if request is not None:
            if self.adapters is not None:
                self.adapters.forget(request)
            self.scheduler.finish_request(request, "abort")
            self._pending.append(self._output(request, time.time()))

    def abort_all(self, reason: FinishReason = "error") -> list[RequestOutput]:
        """End every request (after a failed step); returns their final outputs."""
        outputs, self._pending = self._pending, []
        for request in list(self._requests.values()):
            self.scheduler.finish_request(request, reason)
            outputs.append(self._output(request, time.time()))
        return outputs

    def has_unfinished(self) -> bool:
        return bool(self._requests or self._pending)

    # ---- the step -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule -> run -> postprocess; aborted requests' last outputs come first."""
        outputs, self._pending = self._pending, []
        if self.is_sleeping:
            return outputs
        outputs += self._fail_unloadable_adapters()
        sched = self.scheduler.schedule()
        if sched.is_empty and self.adapters is not None:
            self.adapters.wait_for_loads(ADAPTER_WAIT_S)  # only loads are pending: no spin
        sample = self._run(sched)
        outputs += self._postprocess(sample)
        self._observer.observe(sched, num_generated=len(sample.seqs))
        return outputs

    def _run(self, sched: SchedulerOutput) -> StepSample:
        """One forward over the scheduled chunks, then a token for every sequence that
        reached its end (a just-prefilled `n > 1` request forks first)."""
        if sched.is_empty:
            return StepSample()
        started = time.perf_counter()
        model_out = self.runner.execute(sched)
        self.scheduler.on_step_done(sched)
        seqs, rows = self.scheduler.fork_new_choices(model_out.sample_seqs, self.runner.device)
        logits = model_out.logits
        if len(rows) != logits.shape[0]:
            logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
        result = self.sampler(logits, [seq.sampling_row() for seq in seqs])
        duration = time.perf_counter() - started
        self.total_device_seconds += duration
        sched.charge_device_time(duration)
        return StepSample(
            seqs, result.token_ids, result.logprobs, model_out.embeddings, model_out.prompt_logprobs
        )

    def _fail_unloadable_adapters(self) -> list[RequestOutput]:
        """End the requests whose adapter failed to load (with "error"); others go on."""
        if self.adapters is None:
            return []
        outputs = []
        for request, error in self.adapters.failed():
            logger.warning("request %s: %s", request.request_id, error)
            if request.request_id in self._requests:
                self.scheduler.finish_request(request, "error")
                outputs.append(self._output(request, time.time()))
        return outputs

    def _postprocess(self, sample: StepSample) -> list[RequestOutput]:
        """The output processor decides who finished; the scheduler frees those."""
        now = time.time()
        decisions = self.processor.process(sample, now)
        for seq, reason in decisions.finished:
            self.scheduler.finish_seq(seq, reason)
        return [self._output(request, now) for request in decisions.requests]

    def _output(self, request: Request, now: float) -> RequestOutput:
        """The request's output as of `now`; a finished request leaves the engine with it."""
        finished = request.finished
        if finished:
            request.times.finish_time = now
        output = self.processor.request_output(request)
        if finished:
            del self._requests[request.request_id]
            self.processor.drop(request)
            if self.metrics is not None:
                self.metrics.observe_finished(output.metrics)
        return output

    # ---- sleep mode -----------------------------------------------------------------------

    @property
    def is_sleeping(self) -> bool:
        """True while the KV cache is freed (and, on CUDA, the weights are on the host)."""
        return bool(getattr(self.runner, "sleeping", False))

    def _sleepable(self) -> SleepableRunner:
        runner = self.runner
        if not all(hasattr(runner, a) for a in ("sleep", "wake", "sleeping")):
            raise EngineError(f"{type(runner).__name__} does not support sleep mode")
        return runner  # type: ignore[return-value]

    def sleep(self) -> None:
        """Free the KV cache and move the weights off the device; the engine must be idle.

        The prefix cache is forgotten here, since the blocks' contents go with
        the tensors; the block manager keeps its (all free) bookkeeping so a
        wake re-allocates exactly as many blocks as before.
        """
        if self.has_unfinished():
            raise EngineBusyError(
                f"cannot sleep with {len(self._requests)} request(s) unfinished; drain first"
            )
        runner = self._sleepable()
        if runner.sleeping:
            return
        self.scheduler.reset_prefix_cache()
        started = time.perf_counter()
        runner.sleep()
        logger.info(
            "engine asleep in %.3fs",
            time.perf_counter() - started,
            extra={"event": "engine_sleep"},
        )

    def wake(self) -> None:
        """Weights back on the device from the host copy (no disk), a fresh KV cache."""
        runner = self._sleepable()
        if not runner.sleeping:
            return
        report = LoadReport("wake")
        started = time.perf_counter()
        with report.active():
            runner.wake()
            with timed_phase("prefix_reset"):
                self.scheduler.reset_prefix_cache()
        report.wall_seconds = time.perf_counter() - started
        self.wake_report = report
        report.log(logger, "engine")

    def _check_awake(self) -> None:
        if self.is_sleeping:
            raise EngineSleepingError("the engine is asleep; wake it before adding requests")

    # ---- introspection ------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """While asleep the KV cache holds no block: total and free report 0."""
        if self.is_sleeping:
            return EngineStats(
                num_running=0,
                num_waiting=0,
                kv_usage=0.0,
                num_free_blocks=0,
                num_total_blocks=0,
                prefix_cache_hit_rate=0.0,
            )
        return self.scheduler.stats()
