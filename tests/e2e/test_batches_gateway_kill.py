"""A gateway SIGKILLed in the middle of a batch, and started again on the same data folder.

The batch resumes once the dead runner's lease lapses: it completes with one output line
per custom_id, one ledger row per output line (at the batch price, keyed by the line),
and no line that was stored before the kill runs again (the restarted gateway's log has
no request for it). Lines cut off mid-run stored nothing and were billed nothing: they
run once more, which is their only finished run.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from hydrant_server import hydrant_server

from hydrant.platform.keys import generate_key

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LINES = [
    {
        "custom_id": f"line-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "demo",
            "messages": [{"role": "user", "content": f"Recite verse {i}"}],
            "temperature": 0,
            "max_tokens": 96,
            "ignore_eos": True,  # every line takes a while: the kill lands mid-batch
        },
    }
    for i in range(48)
]


def _finished_requests(log: str) -> list[str]:
    """The request ids of the `request finished` lines of a gateway's log."""
    ids = []
    for text in log.splitlines():
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            continue
        if record.get("msg") == "request finished":
            ids.append(record["request_id"])
    return ids


def _query(data_dir: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(data_dir / "hydrant.db") as db:
        return db.execute(sql, args).fetchall()


def test_a_batch_survives_a_gateway_sigkill(demo_model_dir: Path, tmp_path: Path) -> None:
    admin = generate_key("test").secret
    content = "".join(json.dumps(line) + "\n" for line in LINES).encode()
    with hydrant_server(tmp_path, demo_model_dir, admin_key=admin) as server:
        _, key = server.tenant_key("resilient")
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)
        with client:
            upload = client.files.create(file=("verses.jsonl", content), purpose="batch")
            batch = client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            deadline = time.monotonic() + 120
            while (client.batches.retrieve(batch.id).request_counts.completed or 0) < 8:
                assert time.monotonic() < deadline, "the batch did not start"
                time.sleep(0.2)
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        log_before = server.log_file.read_text(errors="replace")
    assert server.process.returncode == -signal.SIGKILL
    stored = {
        row[0]
        for row in _query(
            tmp_path, "SELECT request_id FROM batch_lines WHERE batch_id = ?", batch.id
        )
    }
    assert 8 <= len(stored) < len(LINES), "the kill did not land mid-batch"

    with hydrant_server(tmp_path, demo_model_dir, admin_key=admin) as restarted:
        client = openai.OpenAI(base_url=f"{restarted.base_url}/v1", api_key=key, max_retries=0)
        with client:
            deadline = time.monotonic() + 180
            while (done := client.batches.retrieve(batch.id)).status != "completed":
                assert done.status in ("in_progress", "finalizing"), done
                assert time.monotonic() < deadline, "the batch was not resumed"
                time.sleep(0.5)
            output = [
                json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()
            ]
        log_after = restarted.log_file.read_text(errors="replace")[len(log_before) :]
    assert sorted(o["custom_id"] for o in output) == sorted(x["custom_id"] for x in LINES)
    assert done.request_counts.completed == len(LINES) and done.request_counts.failed == 0
    rows = [
        r[0]
        for r in _query(
            tmp_path, "SELECT request_id FROM ledger_entries WHERE batch_id = ?", batch.id
        )
    ]
    assert len(rows) == len(set(rows)) == len(output), "a line was billed twice or not at all"
    assert set(rows) == {o["id"] for o in output}
    rerun = stored & set(_finished_requests(log_after))
    assert not rerun, f"lines stored before the kill ran again: {sorted(rerun)}"
    assert stored <= set(_finished_requests(log_before))
