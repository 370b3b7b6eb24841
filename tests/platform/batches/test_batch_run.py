"""A batch on the real demo engine, in-process, its jobs on the gateway's loop (on SQLite
and PostgreSQL): every line
answered as the same request answers interactively, one ledger entry per delivered line
at the batch price, counts and usage, and the output file in OpenAI's line shape."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from batch_helpers import chat_line, gateway, jsonl

from hydrant.platform.billing.pricing import TokenUsage, batch_price, charge_for


async def test_a_batch_answers_each_line_as_interactive_and_bills_it_once(
    data_dir: Path, demo_model_dir: Path, database_url: str
) -> None:
    lines = [
        chat_line(f"q{i}", f"Tell me about {word}", max_tokens=6)
        for i, word in enumerate(["rivers", "lakes", "seas", "clouds"])
    ]
    async with gateway(data_dir, demo_model_dir, database_url=database_url) as gw:
        _, key = await gw.tenant("acme")
        created = await gw.create(key, jsonl(lines))
        assert created.status_code == 200, created.text
        batch = created.json()
        assert batch["object"] == "batch" and batch["status"] == "in_progress", batch["errors"]
        assert batch["model"] == "demo" and batch["request_counts"]["total"] == 4
        done = await gw.wait(key, batch["id"])
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
        assert done["error_file_id"] is None and done["completed_at"] >= done["in_progress_at"]
        output = await gw.content(key, done["output_file_id"])
        assert sorted(o["custom_id"] for o in output) == ["q0", "q1", "q2", "q3"]
        for line, out in zip(lines, sorted(output, key=lambda o: o["custom_id"]), strict=True):
            assert out["error"] is None and out["response"]["status_code"] == 200
            assert out["id"] == out["response"]["request_id"]
            interactive = await gw.client.post(
                "/v1/chat/completions", json=line["body"], headers=gw.auth(key)
            )
            expected = interactive.json()["choices"][0]["message"]["content"]
            assert out["response"]["body"]["choices"][0]["message"]["content"] == expected
        entries = await gw.ledger(batch_id=done["id"])
        assert sorted(e.request_id for e in entries) == sorted(o["id"] for o in output)
        price = batch_price(gw.services.inference.prices("demo"))
        for entry in entries:
            usage = TokenUsage(entry.input_tokens, entry.output_tokens, entry.cached_tokens)
            assert entry.charged == charge_for(usage, price)
            assert entry.charged > Decimal(0)
        assert done["usage"]["input_tokens"] == sum(e.input_tokens for e in entries)
        assert done["usage"]["output_tokens"] == sum(e.output_tokens for e in entries)
