"""Decode CUDA graphs (issue #5): batch buckets, the `enforce_eager` plumbing, the static-buffer
replay path, and (on a GPU) graph decode token-identical to eager decode.

The capture itself needs CUDA. Everything around it runs here on the CPU: a
`DecodeGraphs` whose "replay" is the captured function called eagerly
(`EagerReplay`) drives the runner through the same staging, padding and row
selection as a graph replay, over the same full-width block tables.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

import click
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tiny_models import MAX_POSITIONS, EngineTracker, build_tiny_model, random_prompts

from hydrant.engine.attention import AttentionMetadata
from hydrant.engine.cuda_graphs import (
    MAX_GRAPH_BATCH,
    PAD_CONTEXT_LEN,
    PAD_SLOT,
    DecodeGraphs,
    bucket_for,
    graph_batch_sizes,
    graphs_unsupported,
)
from hydrant.engine.engine_config import EngineConfig
from hydrant.engine.llm_engine import LLMEngine
from hydrant.engine.model_runner import ModelRunner
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request
from hydrant.kernels.cpu.backend import PLANNED
from hydrant.kernels.reference_backend import REFERENCE
from hydrant.kernels.triton_backend import TRITON

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CUDA = torch.cuda.is_available()
_tags = itertools.count()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("graphs"), "gqa", seed=5)


def _runner(engine: LLMEngine) -> ModelRunner:
    assert isinstance(engine.runner, ModelRunner)
    return engine.runner


def _greedy(engine: LLMEngine, prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
    """Greedy continuations; requests of different lengths make the decode batch shrink."""
    tag = f"g{next(_tags)}-"
    for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True)):
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        engine.add_request(Request(f"{tag}{i}", prompt, params))
    finals: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = list(output.outputs[0].token_ids)
    return [finals[f"{tag}{i}"] for i in range(len(prompts))]


# ---- batch buckets ---------------------------------------------------------------------------


@given(st.integers(min_value=1, max_value=2048))
def test_the_buckets_cover_every_batch_the_engine_can_schedule(max_num_seqs: int) -> None:
    sizes = graph_batch_sizes(max_num_seqs)
    assert sizes == sorted(set(sizes))
    assert sizes[:4] == [1, 2, 4, 8][: len(sizes)]
    assert all(s % 8 == 0 for s in sizes[3:])
    assert sizes[-1] <= MAX_GRAPH_BATCH
    assert sizes[-1] >= min(max_num_seqs, MAX_GRAPH_BATCH)  # the largest batch has a graph...
    assert len(sizes) == 1 or sizes[-2] < min(max_num_seqs, MAX_GRAPH_BATCH)  # ...no extra one


@given(st.integers(min_value=1, max_value=512), st.integers(min_value=-3, max_value=600))
def test_a_batch_replays_the_smallest_graph_that_holds_it(max_num_seqs: int, n: int) -> None:
    sizes = graph_batch_sizes(max_num_seqs)
    size = bucket_for(n, sizes)
    if n < 1 or n > sizes[-1]:
        assert size is None
        return
    assert size is not None and size in sizes and size >= n
    assert all(s < n for s in sizes if s < size)  # no smaller one fits
    assert size - n < max(8, n)  # padding: under 8 rows, or under 2x for tiny batches


def test_bucket_examples() -> None:
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(5) == [1, 2, 4, 8]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 24]
    assert graph_batch_sizes(10_000)[-1] == MAX_GRAPH_BATCH
    assert len(graph_batch_sizes(256)) == 3 + 32
    assert [bucket_for(n, [1, 2, 4, 8, 16]) for n in (1, 3, 8, 9, 17)] == [1, 4, 8, 16, None]
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_batch_sizes(0)


# ---- when graphs are used ----------------------------------------------------------------------


def test_graphs_need_cuda_triton_ops_and_no_enforce_eager() -> None:
    cuda = torch.device("cuda")
    assert graphs_unsupported(EngineConfig(), cuda, TRITON) is None
    assert "cpu" in str(graphs_unsupported(EngineConfig(), torch.device("cpu"), TRITON))
    eager = EngineConfig(enforce_eager=True)
    assert "enforce_eager" in str(graphs_unsupported(eager, cuda, TRITON))
    assert "cpu" in str(graphs_unsupported(EngineConfig(), cuda, PLANNED))  # the torch path
    assert "Triton" in str(graphs_unsupported(EngineConfig(), cuda, REFERENCE))


@pytest.mark.parametrize("kernels", ["auto", "hydrant"])
def test_a_cpu_runner_never_builds_graphs(
    model_dir: Path, engines: EngineTracker, kernels: str
) -> None:
    engine = engines.make(model_dir, kernels=kernels)
    runner = _runner(engine)
    assert runner.decode_graphs is None
    _greedy(engine, random_prompts(2, 3, 10, seed=1), [3, 3])
    engine.sleep()
    engine.wake()
    assert runner.decode_graphs is None


# ---- the static-buffer path, replayed eagerly ------------------------------------------------


class EagerReplay(DecodeGraphs):
    """The graph path with the captured function run instead of replayed (no CUDA needed)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sizes_run: list[int] = []
        self.batches_run: list[int] = []

    def run(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor | None:
        logits = super().run(input_ids, *args, **kwargs)
        if logits is not None:
            self.batches_run.append(int(input_ids.shape[0]))
        return logits

    def _replay(self, size: int) -> torch.Tensor:
        self.sizes_run.append(size)
        return self.forward(size)


def _attach(runner: ModelRunner, max_num_seqs: int) -> EagerReplay:
    max_blocks = -(-runner.max_model_len // runner.block_size)
    graphs = EagerReplay(
        runner.model, runner.kv_caches, graph_batch_sizes(max_num_seqs), max_blocks, runner.device
    )
    runner.decode_graphs = graphs
    return graphs


def test_padded_static_buffers_decode_like_the_eager_step(
    model_dir: Path, engines: EngineTracker
) -> None:
    prompts = random_prompts(8, 3, 40, seed=2)
    lengths = [4, 9, 9, 12, 15, 17, 20, 24]  # the batch shrinks 8 -> 7 -> 5 -> 4 -> 3 -> 2 -> 1
    eager = _greedy(engines.make(model_dir), prompts, lengths)
    engine = engines.make(model_dir)
    graphs = _attach(_runner(engine), engine.config.max_num_seqs)
    assert _greedy(engine, prompts, lengths) == eager
    assert graphs.replays == len(graphs.sizes_run) == len(graphs.batches_run) > 0
    ran = set(zip(graphs.batches_run, graphs.sizes_run, strict=True))
    assert {(8, 8), (7, 8), (5, 8), (3, 4), (1, 1)} <= ran  # padded batches among them


def _decode_meta(tables: list[list[int]], lens: list[int], slots: list[int]) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        num_decode_tokens=len(lens),
        decode_block_tables=torch.tensor(tables, dtype=torch.int32),
        decode_context_lens=torch.tensor(lens, dtype=torch.int32),
        prefill_block_tables=torch.zeros((0, 1), dtype=torch.int32),
        prefill_cu_seqlens_q=torch.zeros(1, dtype=torch.int32),
        prefill_context_lens=torch.zeros(0, dtype=torch.int32),
    )


def test_rows_past_the_batch_are_reset_to_padding(model_dir: Path, engines: EngineTracker) -> None:
    runner = _runner(engines.make(model_dir))
    graphs = _attach(runner, 8)
    bs = runner.block_size
    four = _decode_meta([[1, 2], [3, 4], [5, 6], [7, 8]], [20, 21, 22, 23], [bs + 3, 50, 70, 90])
    ids = torch.tensor([5, 6, 7, 8])
    logits = graphs.run(ids, torch.tensor([19, 20, 21, 22]), four, num_sampled=4)
    assert logits is not None and logits.shape == (4, runner.model_config.vocab_size)
    three = _decode_meta([[9], [10], [11]], [3, 4, 5], [9 * bs + 2, 10 * bs + 3, 11 * bs + 4])
    logits = graphs.run(ids[:3], torch.tensor([2, 3, 4]), three, num_sampled=3)
    assert logits is not None and logits.shape[0] == 3
    assert graphs.sizes_run == [4, 4]
    assert graphs.slot_mapping[:4].tolist() == [9 * bs + 2, 10 * bs + 3, 11 * bs + 4, PAD_SLOT]
    assert graphs.context_lens[:4].tolist() == [3, 4, 5, PAD_CONTEXT_LEN]
    assert graphs.block_tables[3].abs().sum() == 0
    assert graphs.block_tables[:3, 0].tolist() == [9, 10, 11]


def test_steps_a_graph_cannot_serve_run_eagerly(model_dir: Path, engines: EngineTracker) -> None:
    runner = _runner(engines.make(model_dir))
    graphs = _attach(runner, 4)
    ids, pos = torch.tensor([1, 2]), torch.tensor([3, 4])
    meta = _decode_meta([[1], [2]], [4, 5], [19, 36])
    assert graphs.run(ids, pos, meta, num_sampled=1) is None  # a row not sampled
    with_prefill = _decode_meta([[1]], [4], [19, 36])
    assert graphs.run(ids, pos, with_prefill, num_sampled=2) is None  # 1 decode + 1 prefill
    five = _decode_meta([[1]] * 5, [4] * 5, list(range(5)))
    assert graphs.run(torch.arange(5), torch.arange(5), five, num_sampled=5) is None
    too_wide = _decode_meta([[0] * (graphs.block_tables.shape[1] + 1)] * 2, [4, 5], [19, 36])
    assert graphs.run(ids, pos, too_wide, num_sampled=2) is None
    assert graphs.replays == 0
    assert graphs.run(ids, pos, meta, num_sampled=2) is not None  # the control: this one runs


class FakeCuda:
    """Stands in for torch.cuda's graph API on the CPU: records what capture asks of it."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.pool = object()
        self.events: list[tuple[str, Any]] = []
        fake = self

        class Graph:
            def replay(self) -> None:
                fake.events.append(("replay", self))

        self.Graph = Graph

    @contextlib.contextmanager
    def graph(self, graph: Any, pool: Any = None, capture_error_mode: str = "global") -> Any:
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.events.append(("capture", (graph, pool, capture_error_mode)))
        yield

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: self.pool)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", self.Graph)
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: self.events.append(("empty", None)))


def test_capture_warms_up_then_captures_largest_first_into_one_pool(
    model_dir: Path, engines: EngineTracker, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = _runner(engines.make(model_dir))
    graphs = DecodeGraphs(runner.model, runner.kv_caches, [1, 2, 4, 8], 16, runner.device)
    forwards: list[int] = []
    real_forward = graphs.forward

    def forward(size: int) -> torch.Tensor:
        forwards.append(size)
        return real_forward(size)

    monkeypatch.setattr(graphs, "forward", forward)
    fake = FakeCuda()
    fake.install(monkeypatch)
    graphs.capture()
    assert forwards == [8, 8, 4, 4, 2, 2, 1, 1]  # a warm-up, then the capture, largest first
    captures = [args for kind, args in fake.events if kind == "capture"]
    assert [pool for _, pool, _ in captures] == [fake.pool] * 4
    assert {mode for _, _, mode in captures} == {"thread_local"}
    ids, pos = torch.tensor([3, 4, 5]), torch.tensor([1, 2, 3])
    logits = graphs.run(ids, pos, _decode_meta([[1], [2], [3]], [2, 3, 4], [17, 34, 51]), 3)
    assert logits is not None and logits.shape == (3, runner.model_config.vocab_size)
    replayed = [g for kind, g in fake.events if kind == "replay"]
    assert replayed == [captures[1][0]]  # the size-4 graph


@pytest.mark.parametrize("fail", [False, True])
def test_a_failed_capture_leaves_the_runner_eager(
    model_dir: Path,
    engines: EngineTracker,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fail: bool,
) -> None:
    from hydrant.engine import cuda_graphs
    from hydrant.engine.load_report import LoadReport

    runner = _runner(engines.make(model_dir, max_num_seqs=4))
    monkeypatch.setattr(cuda_graphs, "graphs_unsupported", lambda *a: None)  # "on CUDA"
    fake = FakeCuda(fail=fail)
    fake.install(monkeypatch)
    report = LoadReport()
    with report.active(), caplog.at_level("INFO", logger=cuda_graphs.__name__):
        graphs = cuda_graphs.capture_decode_graphs(
            runner.model, runner.kv_caches, runner.config, runner.max_model_len, runner.device
        )
    assert "cuda_graphs" in report.phases
    if fail:
        assert graphs is None and ("empty", None) in fake.events
        assert any(r.levelname == "WARNING" and "eager" in r.message for r in caplog.records)
    else:
        assert graphs is not None and graphs.sizes == [1, 2, 4]
        assert graphs.block_tables.shape == (4, MAX_POSITIONS // runner.block_size)
        assert any("3 batch sizes up to 4" in r.message for r in caplog.records)


# ---- enforce_eager from settings, flags and workers ------------------------------------------


def test_enforce_eager_is_a_setting_off_by_default() -> None:
    from hydrant.errors import ConfigurationError
    from hydrant.settings import load_settings

    assert EngineConfig().enforce_eager is False
    assert EngineConfig(enforce_eager=True).enforce_eager is True
    assert load_settings({}).enforce_eager is False
    assert load_settings({"HYDRANT_ENFORCE_EAGER": "true"}).enforce_eager is True
    assert load_settings({"HYDRANT_ENFORCE_EAGER": "0"}).enforce_eager is False
    with pytest.raises(ConfigurationError, match="HYDRANT_ENFORCE_EAGER"):
        load_settings({"HYDRANT_ENFORCE_EAGER": "sometimes"})


@pytest.mark.parametrize("command", ["serve", "worker"])
def test_the_flag_is_parsed_and_absent_leaves_the_setting_in_charge(command: str) -> None:
    from hydrant.cli.serve import serve
    from hydrant.cli.workercmd import worker

    cmd: click.Command = serve if command == "serve" else worker
    base = ["--model", "m"] if command == "worker" else []
    assert cmd.make_context(command, [*base, "--enforce-eager"]).params["enforce_eager"] is True
    assert cmd.make_context(command, base).params["enforce_eager"] is None


def test_serve_hands_the_setting_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from hydrant import runtime
    from hydrant.engine.llm_engine import LLMEngine
    from hydrant.settings import ModelSpec, load_settings

    seen: list[EngineConfig] = []

    def fake_load(path: Path, config: EngineConfig, **_: Any) -> LLMEngine:
        seen.append(config)
        raise RuntimeError("stop here")

    monkeypatch.setattr(LLMEngine, "from_pretrained", fake_load)
    settings = load_settings(
        {"HYDRANT_ENFORCE_EAGER": "1"}, models=(ModelSpec("m", Path("/nowhere")),)
    )
    with pytest.raises(RuntimeError, match="stop here"):
        runtime.load_embedded_engines(settings)
    assert [c.enforce_eager for c in seen] == [True]


@pytest.mark.parametrize("eager", [True, False])
def test_a_worker_builds_its_engine_with_the_setting(model_dir: Path, eager: bool) -> None:
    from hydrant.engine.worker.runtime import WorkerOptions, WorkerRuntime

    options = WorkerOptions(
        model="tiny", path=str(model_dir), secret="s", kv_cache_bytes=1 << 22, enforce_eager=eager
    )
    engine = WorkerRuntime(options)._build(str(model_dir), None)
    assert _runner(engine).config.enforce_eager is eager


# ---- on a GPU: the real capture --------------------------------------------------------------

GPU_CONFIGS: list[dict[str, Any]] = [
    {},
    {"kv_cache_dtype": "int8"},
    {"quantization": "int8"},
    {"quantization": "int4", "kv_cache_dtype": "int8"},  # the W4A16 GEMV inside the graphs
]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("extra", GPU_CONFIGS, ids=["float", "kv-int8", "w8a16", "w4a16-kv-int8"])
def test_graph_decode_is_token_identical_to_eager_on_cuda(
    model_dir: Path, engines: EngineTracker, extra: dict[str, Any]
) -> None:
    common = {"device": "cuda", "num_gpu_blocks": 256, "max_num_seqs": 16, **extra}
    prompts = random_prompts(8, 3, 60, seed=4)
    lengths = [6, 10, 10, 16, 20, 24, 28, 32]
    eager_engine = engines.make(model_dir, enforce_eager=True, **common)
    assert _runner(eager_engine).decode_graphs is None
    eager = _greedy(eager_engine, prompts, lengths)

    engine = engines.make(model_dir, **common)
    graphs = _runner(engine).decode_graphs
    assert graphs is not None and graphs.sizes == [1, 2, 4, 8, 16]
    assert _greedy(engine, prompts, lengths) == eager
    assert graphs.replays > 0

    engine.sleep()  # the cache goes: so do the graphs; the wake captures new ones
    assert _runner(engine).decode_graphs is None
    engine.wake()
    rewoken = _runner(engine).decode_graphs
    assert rewoken is not None and rewoken is not graphs
    assert _greedy(engine, prompts, lengths) == eager
    assert rewoken.replays > 0
    assert engine.wake_report is not None and "cuda_graphs" in engine.wake_report.phases


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_the_load_report_times_the_capture(model_dir: Path, engines: EngineTracker) -> None:
    engine = engines.make(model_dir, device="cuda", num_gpu_blocks=64, max_num_seqs=8)
    assert engine.load_report is not None and engine.load_report.phases["cuda_graphs"] > 0
    graphs = _runner(engine).decode_graphs
    assert graphs is not None
    assert graphs.block_tables.shape == (8, MAX_POSITIONS // engine.config.block_size)
