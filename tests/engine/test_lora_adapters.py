"""Adapter files the engine refuses, slots it evicts, and loads that fail one request only.

A refused adapter is a clear `AdapterError` (an `InvalidRequestError`, the worker's 400)
naming what is wrong; nothing of it reaches a device. The slot cache keeps `max_loras`
adapters and evicts the least recently used one no running sequence pins.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lora_models import AdapterSpec, build_adapter, edit_config
from tiny_models import EngineTracker, build_tiny_model, random_prompts

from hydrant.engine.async_engine import running
from hydrant.engine.capacity import RequestLengths, plan_capacity
from hydrant.engine.capacity_shapes import ModelShape
from hydrant.engine.config import ModelConfig
from hydrant.engine.errors import InvalidRequestError
from hydrant.engine.inprocess import InProcessEngineClient
from hydrant.engine.lora_adapter import TARGET_MODULES, AdapterError, load_adapter
from hydrant.engine.protocol import AdapterRef, GenerateRequest, Sampling
from hydrant.engine.sampling_params import SamplingParams
from hydrant.engine.sequence import Request

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QV = AdapterSpec(8, 16, ("q_proj", "v_proj"))
QV_DTYPE = torch.float32


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bases")
    return {family: build_tiny_model(root / family, family) for family in ("llama", "gqa")}


@pytest.fixture(scope="module")
def qv(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> AdapterRef:
    return build_adapter(models["llama"], tmp_path_factory.mktemp("qv") / "qv", QV, seed=1)


def _copy(ref: AdapterRef, tmp_path: Path, name: str) -> AdapterRef:
    target = tmp_path / name
    shutil.copytree(ref.path, target)
    return AdapterRef(name=name, path=str(target))


def _load(ref: AdapterRef, model: Path, max_rank: int = 64) -> None:
    load_adapter(ref.name, ref.path, ModelConfig.from_pretrained(model), max_rank, QV_DTYPE)


def test_scaling_is_peft_s_with_and_without_rslora(
    models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    config = ModelConfig.from_pretrained(models["llama"])
    adapter = load_adapter(qv.name, qv.path, config, 64, QV_DTYPE)
    assert (adapter.rank, adapter.scaling, adapter.modules) == (8, 2.0, {"q_proj", "v_proj"})
    rs = _copy(qv, tmp_path, "rs")
    edit_config(rs, use_rslora=True)
    assert load_adapter(rs.name, rs.path, config, 64, QV_DTYPE).scaling == pytest.approx(
        16 / 8**0.5
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "lora_only"}, "bias='lora_only'"),
        ({"target_modules": ["q_proj", "embed_tokens"]}, r"\['embed_tokens'\] are not among"),
        ({"rank_pattern": {"q_proj": 4}}, "rank_pattern"),
        ({"peft_type": "IA3"}, "is not LORA"),
        ({"r": 0}, "r must be a positive integer"),
    ],
)
def test_unsupported_configs_are_refused_by_name(
    models: dict[str, Path],
    qv: AdapterRef,
    tmp_path: Path,
    changes: dict[str, object],
    message: str,
) -> None:
    ref = _copy(qv, tmp_path, "edited")
    edit_config(ref, **changes)
    with pytest.raises(AdapterError, match=message) as caught:
        _load(ref, models["llama"])
    assert caught.value.param == "model" and "'edited'" in caught.value.message


def test_rank_shape_and_missing_files_are_refused(
    models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    with pytest.raises(AdapterError, match="rank 8 exceeds this engine's max_lora_rank 4"):
        _load(qv, models["llama"], max_rank=4)
    with pytest.raises(AdapterError, match="do not fit the base model"):
        _load(qv, models["gqa"])  # k/v are narrower there (2 KV heads of a wider model)
    with pytest.raises(AdapterError, match="does not exist"):
        _load(AdapterRef(name="gone", path=str(tmp_path / "nowhere")), models["llama"])
    bare = _copy(qv, tmp_path, "bare")
    (Path(bare.path) / "adapter_model.safetensors").unlink()
    with pytest.raises(AdapterError, match="only safetensors are read"):
        _load(bare, models["llama"])


def test_a_bad_adapter_fails_its_request_only(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    engine = engines.make(models["llama"])
    broken = _copy(qv, tmp_path, "broken")
    edit_config(broken, use_dora=True)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = random_prompts(1, 12, 13)[0]
    engine.add_request(Request("bad", prompt, params, adapter=broken))
    engine.add_request(Request("good", prompt, params, adapter=qv))
    engine.add_request(Request("base", prompt, params))
    finals = {}
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["bad"].outputs[0].finish_reason == "error"
    assert finals["bad"].outputs[0].token_ids == []
    assert [len(finals[r].outputs[0].token_ids) for r in ("good", "base")] == [4, 4]


def test_slots_keep_max_loras_and_evict_the_least_recently_used(
    engines: EngineTracker, models: dict[str, Path], tmp_path: Path
) -> None:
    refs = [
        build_adapter(models["llama"], tmp_path / f"a{i}", AdapterSpec(2 + i, 4, ("o_proj",)), i)
        for i in range(3)
    ]
    engine = engines.make(models["llama"], max_loras=2, max_cpu_loras=2)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    order = [0, 1, 0, 2]  # a2 takes a1's slot: a0 was used more recently
    for i, which in enumerate(order):
        engine.add_request(Request(f"r{i}", [5, 6, 7], params, adapter=refs[which]))
        while engine.has_unfinished():
            engine.step()
    assert engine.runner.lora_slots.resident == ("a0", "a2")
    assert set(engine.stats().loaded_adapters) == {"a0", "a2"}
    # three adapters at once, two slots: the third waits for a slot and still finishes
    for i, ref in enumerate(refs):
        engine.add_request(Request(f"all{i}", [5, 6, 7], SamplingParams(max_tokens=5), adapter=ref))
    done = set()
    while engine.has_unfinished():
        assert sum(p > 0 for p in engine.runner.lora_slots.pins) <= 2
        done |= {o.request_id for o in engine.step() if o.finished}
    assert done == {"all0", "all1", "all2"}
    assert engine.runner.lora_slots.pins == [0, 0]


async def test_the_in_process_client_refuses_a_bad_adapter_before_any_chunk(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    engine = engines.make(models["llama"])
    broken = _copy(qv, tmp_path, "wrong-shape")
    edit_config(broken, r=4)  # the tensors are rank 8
    async with running(engine) as front:
        client = InProcessEngineClient(front)

        def request(rid: str, ref: AdapterRef) -> GenerateRequest:
            sampling = Sampling(max_tokens=3, temperature=0.0)
            return GenerateRequest(
                request_id=rid, prompt_token_ids=[9, 8, 7], sampling=sampling, adapter=ref
            )

        with pytest.raises(InvalidRequestError, match="do not fit the base model"):
            async for _ in client.generate(request("bad", broken)):
                pass
        chunks = [c async for c in client.generate(request("good", qv))]
        assert chunks[-1].finished and chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens == 3
        assert client.stats().loaded_adapters == ("qv",)


def test_sleep_frees_the_slots_and_the_adapter_comes_back_after_wake(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef
) -> None:
    engine = engines.make(models["llama"])
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    outputs = []
    for rid in ("before", "after"):
        engine.add_request(Request(rid, [3, 4, 5, 6], params, adapter=qv))
        while engine.has_unfinished():
            outputs += [o for o in engine.step() if o.finished]
        assert engine.runner.lora_slots.resident == ("qv",)
        if rid == "before":
            engine.sleep()
            assert engine.runner.lora_slots.resident == ()
            assert all(not stacks for stacks in engine.runner.lora_slots.stacks)
            engine.wake()
    assert outputs[0].outputs[0].token_ids == outputs[1].outputs[0].token_ids


def test_capacity_counts_the_slots_the_engine_allocates(
    engines: EngineTracker, models: dict[str, Path], tmp_path: Path
) -> None:
    """`hydrant capacity`'s LoRA term is what the slots really take once every projection
    is targeted, and what the CUDA KV budget leaves free (`full_bytes`)."""
    every = AdapterSpec(4, 8, TARGET_MODULES)
    ref = build_adapter(models["llama"], tmp_path / "every", every, seed=4)
    engine = engines.make(models["llama"], max_loras=3, max_lora_rank=16)
    engine.add_request(Request("r", [1, 2, 3], SamplingParams(max_tokens=1), adapter=ref))
    while engine.has_unfinished():
        engine.step()
    slots = engine.runner.lora_slots
    assert slots is not None
    held = sum(t.nbytes for layer in slots.stacks for stack in layer.values() for t in stack)
    shape = ModelShape.from_config(json.loads((models["llama"] / "config.json").read_text()))
    assert held == slots.full_bytes() == 3 * shape.lora_slot_params(16) * 4
    lengths = RequestLengths.fixed(100, 100)
    without = plan_capacity(shape, device_memory_gib=2, requests=lengths, weight_dtype="float32")
    with_slots = plan_capacity(
        shape,
        device_memory_gib=2,
        requests=lengths,
        weight_dtype="float32",
        max_loras=3,
        max_lora_rank=16,
    )
    assert without.kv_cache_bytes - with_slots.kv_cache_bytes == held == with_slots.lora_bytes


def test_forked_choices_run_with_their_parent_s_adapter(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef
) -> None:
    """`n > 1`: the choices forked after the prompt share its slot (pinned once each) and
    decode with the adapter; every pin is released when they finish."""
    engine = engines.make(models["llama"])
    prompt = random_prompts(1, 15, 16, seed=2)[0]
    finals = {}
    for rid, n in (("one", 1), ("three", 3)):
        params = SamplingParams(n=n, max_tokens=5, temperature=0.0, ignore_eos=True)
        engine.add_request(Request(rid, prompt, params, adapter=qv))
        while engine.has_unfinished():
            finals.update({o.request_id: o for o in engine.step() if o.finished})
    single = finals["one"].outputs[0].token_ids
    assert [c.token_ids for c in finals["three"].outputs] == [single] * 3
    assert engine.runner.lora_slots is not None and engine.runner.lora_slots.pins[0] == 0


def _hung_adapter(
    ref: AdapterRef, tmp_path: Path, name: str
) -> tuple[AdapterRef, Callable[[], None]]:
    """A copy of `ref` whose adapter_config.json is a FIFO nobody writes yet: reading it
    blocks in `open` (as on a hung network mount) until `release()` writes the config."""
    slow = _copy(ref, tmp_path, name)
    config = Path(slow.path) / "adapter_config.json"
    text = config.read_bytes()
    config.unlink()
    os.mkfifo(config)

    def release() -> None:
        deadline = time.monotonic() + 10
        while True:
            try:
                fd = os.open(config, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: its reader has not opened it yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            try:
                os.write(fd, text)
            finally:
                os.close(fd)
            return

    return slow, release


def test_an_adapter_still_loading_never_stalls_the_other_requests(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    """An adapter whose files are slow to read holds up only its own request: the base
    model's and another adapter's requests run to their end meanwhile, and the slow one
    then answers what it answers when its files are there at once."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompt = random_prompts(1, 12, 13, seed=4)[0]
    reference = engines.make(models["llama"])
    reference.add_request(Request("want", prompt, params, adapter=qv))
    want = {}
    while reference.has_unfinished():
        want.update({o.request_id: o for o in reference.step() if o.finished})

    slow, release = _hung_adapter(qv, tmp_path, "slow")
    engine = engines.make(models["llama"])
    try:
        engine.add_request(Request("slow", prompt, params, adapter=slow))
        engine.add_request(Request("base", prompt, params))
        engine.add_request(Request("other", prompt, params, adapter=qv))
        finals = {}
        for _ in range(200):
            finals.update({o.request_id: o for o in engine.step() if o.finished})
            if {"base", "other"} <= set(finals):
                break
        assert {"base", "other"} <= set(finals), "the step loop stalled behind a load"
        assert "slow" not in finals
        assert [len(finals[r].outputs[0].token_ids) for r in ("base", "other")] == [12, 12]
    finally:
        release()
    while engine.has_unfinished():
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["slow"].outputs[0].token_ids == want["want"].outputs[0].token_ids
    assert finals["other"].outputs[0].token_ids == want["want"].outputs[0].token_ids


async def test_the_async_front_serves_the_others_while_an_adapter_loads(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    """The path workers and the embedded engine take: the front reads a request's adapter
    before queuing it, so a slow read keeps that request out of the step loop, and the
    base model's and another adapter's requests are served in full meanwhile."""
    slow, release = _hung_adapter(qv, tmp_path, "slow")
    engine = engines.make(models["llama"])

    def request(rid: str, ref: AdapterRef | None) -> GenerateRequest:
        sampling = Sampling(max_tokens=6, temperature=0.0, ignore_eos=True)
        return GenerateRequest(
            request_id=rid, prompt_token_ids=[9, 8, 7, 6], sampling=sampling, adapter=ref
        )

    async with running(engine) as front:
        client = InProcessEngineClient(front)

        async def tokens(rid: str, ref: AdapterRef | None) -> list[int]:
            out: list[int] = []
            async for chunk in client.generate(request(rid, ref)):
                out += [t for choice in chunk.choices for t in choice.token_ids]
            return out

        waiting = asyncio.create_task(tokens("slow", slow))
        leaving = asyncio.create_task(tokens("leaves", slow))  # shares the load, then goes
        try:
            other = await asyncio.wait_for(tokens("other", qv), 60)
            base = await asyncio.wait_for(tokens("base", None), 60)
            assert len(other) == len(base) == 6 and other != base
            assert not waiting.done()
            leaving.cancel()  # its client left: the load the other request waits on goes on
            with pytest.raises(asyncio.CancelledError):
                await leaving
        finally:
            await asyncio.to_thread(release)
        assert await asyncio.wait_for(waiting, 60) == other


def test_an_adapter_registered_again_at_another_path_runs_its_new_weights(
    engines: EngineTracker, models: dict[str, Path], qv: AdapterRef, tmp_path: Path
) -> None:
    """The platform lets an admin remove an adapter and register a new version under the
    same name at another directory, with no restart. The engine holds the old one in host
    memory, a device slot and the prefix cache: none of them may answer for the new one."""
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompt = random_prompts(1, 24, 25, seed=6)[0]
    newer = build_adapter(models["llama"], tmp_path / "qv-v2", AdapterSpec(8, 64, QV.targets), 9)
    fresh = engines.make(models["llama"])
    fresh.add_request(Request("want", prompt, params, adapter=newer))
    want = {}
    while fresh.has_unfinished():
        want.update({o.request_id: o for o in fresh.step() if o.finished})

    engine = engines.make(models["llama"], block_size=8)
    finals = {}
    for rid, ref in (("old", qv), ("new", AdapterRef(name="qv", path=newer.path))):
        engine.add_request(Request(rid, prompt, params, adapter=ref))
        while engine.has_unfinished():
            finals.update({o.request_id: o for o in engine.step() if o.finished})
    assert finals["old"].outputs[0].token_ids != want["want"].outputs[0].token_ids
    assert finals["new"].outputs[0].token_ids == want["want"].outputs[0].token_ids
    assert finals["new"].metrics.cached_tokens == 0  # the old version's K/V is not reused
    assert engine.stats().loaded_adapters == ("qv",)
