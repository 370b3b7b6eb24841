"""The official `openai` client against `/v1/files` on a real `hydrant serve`: upload,
retrieve, list, content and delete, and the tenant triad as the client raises it."""

from __future__ import annotations

import json

import openai
import pytest
from hydrant_server import RunningServer

pytestmark = pytest.mark.slow

LINES = [
    {
        "custom_id": f"q{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "demo", "messages": [{"role": "user", "content": f"Hi {i}"}]},
    }
    for i in range(3)
]
CONTENT = "".join(json.dumps(line) + "\n" for line in LINES).encode()


def test_files_with_the_official_client(server: RunningServer, client: openai.OpenAI) -> None:
    created = client.files.create(file=("input.jsonl", CONTENT), purpose="batch")
    assert created.object == "file" and created.purpose == "batch"
    assert created.bytes == len(CONTENT) and created.filename == "input.jsonl"
    assert client.files.retrieve(created.id) == created
    assert client.files.content(created.id).content == CONTENT
    assert [f.id for f in client.files.list(purpose="batch")] == [created.id]

    _, other_key = server.tenant_key("files-other")
    with openai.OpenAI(base_url=client.base_url, api_key=other_key, max_retries=0) as other:
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            other.files.content(created.id)
        with pytest.raises(openai.NotFoundError):
            other.files.delete(created.id)
        assert list(other.files.list()) == []
    anonymous = openai.OpenAI(base_url=client.base_url, api_key="hyd_test_nope", max_retries=0)
    with anonymous, pytest.raises(openai.AuthenticationError):
        anonymous.files.retrieve(created.id)

    deleted = client.files.delete(created.id)
    assert deleted.id == created.id and deleted.deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", CONTENT), purpose="assistants")
