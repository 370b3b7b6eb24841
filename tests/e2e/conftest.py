"""The shared demo-model server of the API tests, one per module that asks for it.

A module that defines its own `server` or `client` (another model, other settings)
overrides these.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from hydrant_server import RunningServer, hydrant_server


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
