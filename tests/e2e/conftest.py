"""The shared demo-model server of the API tests, one per module that asks for it, and the
session's one `vllm serve` (upstream pools).

A module that defines its own `server` or `client` (another model, other settings)
overrides these.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from hydrant_server import RunningServer, hydrant_server
from vllm_peer import VllmPeer, vllm_serve

LONG_CONTEXT = 16384


@pytest.fixture(scope="module")
def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with hydrant_server(tmp_path_factory.mktemp("serve"), demo_model_dir) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer, request: pytest.FixtureRequest) -> Iterator[openai.OpenAI]:
    """An `openai` client with a key of a tenant named after the test module. Closed after
    the module: a pooled socket left to the garbage collector is a ResourceWarning, which
    fails whichever test happens to be running then."""
    _, secret = server.tenant_key(request.module.__name__.removeprefix("test_"))
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0) as client:
        yield client


@pytest.fixture(scope="session")
def long_demo_dir(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model with a 16k context (RoPE serves any position; the weights are the
    same): a request can then decode for many seconds, so a client's disconnect reaches
    vLLM while it still runs, however fast or loaded this machine is."""
    target = tmp_path_factory.mktemp("models") / "demo-16k"
    shutil.copytree(demo_model_dir, target)
    config = json.loads((target / "config.json").read_text("utf-8"))
    config["max_position_embeddings"] = LONG_CONTEXT
    (target / "config.json").write_text(json.dumps(config), "utf-8")
    return target


@pytest.fixture(scope="session")
def vllm(long_demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmPeer]:
    with vllm_serve(long_demo_dir, tmp_path_factory.mktemp("vllm")) as peer:
        yield peer
