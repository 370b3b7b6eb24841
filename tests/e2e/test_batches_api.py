"""The official `openai` client against the Batch API on a real `hydrant serve`: a batch
made from an uploaded file and polled to `completed` answers each custom_id as the same
request answers interactively at temperature 0; its ledger rows are its output lines at
the batch price; a cancelled batch bills only the lines it served; a batch whose
reservation exceeds the tenant's budget is refused when it is made."""

from __future__ import annotations

import json
import sqlite3
import time
from decimal import Decimal
from typing import Any

import openai
import pytest
from hydrant_server import RunningServer

from hydrant.platform.billing.pricing import Price, TokenUsage, batch_price, charge_for

pytestmark = pytest.mark.slow

WORDS = ["rivers", "mountains", "bread", "the sea", "winter", "clocks"]


def _line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "demo",
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": 12,
            **body,
        },
    }


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _poll(client: openai.OpenAI, batch_id: str, timeout_s: float = 180) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)


def _ledger(server: RunningServer, batch_id: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(server.data_dir / "hydrant.db") as db:
        return db.execute(
            "SELECT request_id, input_tokens, cached_tokens, output_tokens, charged "
            "FROM ledger_entries WHERE batch_id = ?",
            (batch_id,),
        ).fetchall()


def _demo_price(server: RunningServer) -> Price:
    with server.admin() as admin:
        model = next(m for m in admin.get("/admin/models").json()["data"] if m["name"] == "demo")
        version = admin.get(f"/admin/models/{model['id']}/prices").json()["data"][-1]
    return batch_price(
        Price(
            input_per_million=Decimal(version["input_per_mtok"]),
            output_per_million=Decimal(version["output_per_mtok"]),
            cached_input_per_million=Decimal(version["cached_input_per_mtok"]),
        )
    )


def test_a_batch_with_the_official_client(server: RunningServer, client: openai.OpenAI) -> None:
    lines = [_line(f"req-{i}", f"Tell me about {word}") for i, word in enumerate(WORDS)]
    upload = client.files.create(file=("batch.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "e2e"},
    )
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"job": "e2e"}
    done = _poll(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == len(lines)
    assert done.output_file_id is not None and done.error_file_id is None
    output = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(o["custom_id"] for o in output) == sorted(line["custom_id"] for line in lines)
    by_id = {o["custom_id"]: o for o in output}
    for line in lines:
        interactive = client.chat.completions.create(**line["body"])
        answer = by_id[line["custom_id"]]["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == interactive.choices[0].message.content
    rows = _ledger(server, done.id)
    assert sorted(r[0] for r in rows) == sorted(o["id"] for o in output)
    price = _demo_price(server)
    for _, prompt, cached, completion, charged in rows:
        expected = charge_for(TokenUsage(prompt, completion, cached), price)
        assert Decimal(str(charged)) == expected
    assert [b.id for b in client.batches.list(limit=5)][:1] == [done.id]


def test_cancel_bills_only_the_lines_served(server: RunningServer, client: openai.OpenAI) -> None:
    # Every line runs its 96 tokens, so the batch is still running when it is cancelled.
    lines = [
        _line(f"slow-{i}", f"Count to {i}", max_tokens=96, ignore_eos=True) for i in range(160)
    ]
    upload = client.files.create(file=("slow.jsonl", _jsonl(lines)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while (client.batches.retrieve(batch.id).request_counts.completed or 0) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = _poll(client, batch.id)
    assert done.status == "cancelled"
    served = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert 2 <= len(served) < len(lines)
    rows = _ledger(server, batch.id)
    assert sorted(r[0] for r in rows) == sorted(o["id"] for o in served)
    time.sleep(1.5)  # nothing is billed after the end
    assert len(_ledger(server, batch.id)) == len(rows)


def test_a_batch_over_the_budget_is_refused_when_made(server: RunningServer) -> None:
    plan = server.create_plan("tight-batches", spend_per_day="0.000010")
    _, key = server.tenant_key("tight", plan=plan)
    lines = [_line(f"r{i}", "Write a long story", max_tokens=256) for i in range(20)]
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0) as tight:
        upload = tight.files.create(file=("big.jsonl", _jsonl(lines)), purpose="batch")
        with pytest.raises(openai.RateLimitError) as refused:
            tight.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        assert "spend_day" in str(refused.value)
        assert list(tight.batches.list()) == []
