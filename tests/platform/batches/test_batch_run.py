"""A batch on the real demo engine, in-process, its jobs on the gateway's loop (on SQLite
and PostgreSQL): every line
answered as the same request answers interactively, one ledger entry per delivered line
at the batch price, counts and usage, and the output file in OpenAI's line shape."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path

from batch_helpers import chat_line, gateway, jsonl

from hydrant.platform.billing.pricing import TokenUsage, batch_price, charge_for
from hydrant.platform.db.models import Batch


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


async def test_every_batch_endpoint_answers_as_its_route(
    data_dir: Path, demo_model_dir: Path
) -> None:
    bodies = {
        "/v1/completions": {
            "model": "demo",
            "prompt": "Once upon",
            "max_tokens": 5,
            "temperature": 0,
        },
        "/v1/embeddings": {"model": "demo", "input": ["a river", "a lake"]},
        "/v1/responses": {
            "model": "demo",
            "input": "Say hi",
            "max_output_tokens": 5,
            "temperature": 0,
        },
    }
    async with gateway(data_dir, demo_model_dir) as gw:
        _, key = await gw.tenant("acme")
        for endpoint, body in bodies.items():
            line = {"custom_id": "one", "method": "POST", "url": endpoint, "body": body}
            created = await gw.create(key, jsonl([line]), endpoint=endpoint)
            assert created.status_code == 200, created.text
            done = await gw.wait(key, created.json()["id"])
            assert done["status"] == "completed", (endpoint, done)
            [out] = await gw.content(key, done["output_file_id"])
            answer = out["response"]["body"]
            interactive = (await gw.client.post(endpoint, json=body, headers=gw.auth(key))).json()
            assert answer["object"] == interactive["object"]
            if endpoint == "/v1/embeddings":
                assert [d["embedding"] for d in answer["data"]] == [
                    d["embedding"] for d in interactive["data"]
                ]
            elif endpoint == "/v1/completions":
                assert answer["choices"][0]["text"] == interactive["choices"][0]["text"]
            else:
                assert answer["output"][-1]["content"] == interactive["output"][-1]["content"]
        chained = {"model": "demo", "input": "Go on", "previous_response_id": "resp_x"}
        line = {"custom_id": "c", "method": "POST", "url": "/v1/responses", "body": chained}
        failed = (await gw.create(key, jsonl([line]), endpoint="/v1/responses")).json()
        assert failed["status"] == "failed"
        assert failed["errors"]["data"][0]["param"] == "previous_response_id"


async def test_a_suspended_tenants_batch_stops_with_what_it_served(
    data_dir: Path, demo_model_dir: Path
) -> None:
    lines = [chat_line(f"q{i}", "hi", max_tokens=4) for i in range(3)]
    async with gateway(data_dir, demo_model_dir, embedded_jobs=False) as gw:
        tenant_id, key = await gw.tenant("acme")
        batch = (await gw.create(key, jsonl(lines))).json()  # no job loop: nothing ran yet
        suspended = await gw.client.post(
            f"/admin/tenants/{tenant_id}/suspend", headers=gw.auth(gw.admin)
        )
        assert suspended.status_code == 200, suspended.text
        runner = gw.services.inference.runner
        outcome = await asyncio.to_thread(gw.client.blocking_portal.call, runner.run, batch["id"])
        assert outcome == "failed"
        assert await gw.ledger(batch_id=batch["id"]) == []
        async with gw.services.database.session() as session:  # the key no longer reads it
            row = await session.get(Batch, batch["id"])
        assert row is not None and row.errors and row.errors[0]["code"] == "tenant_suspended"
