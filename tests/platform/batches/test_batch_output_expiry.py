"""OpenAI's `output_expires_after`: a batch's output and error files expire that long after
they are made (their `expires_at` says so) and the retention job deletes them then; the
parameter is checked as OpenAI checks it (anchor `created_at`, 1 hour to 30 days)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

from batch_helpers import Gateway, chat_line, gateway, jsonl

from hydrant.platform.db.base import utcnow


async def _create(gw: Gateway, key: str, file_id: str, expiry: Any) -> Any:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "output_expires_after": expiry,
    }
    return await gw.client.post("/v1/batches", json=body, headers=gw.auth(key))


async def test_output_files_expire_as_asked_and_the_retention_job_deletes_them(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir) as gw:
        _, key = await gw.tenant("acme")
        lines = [chat_line("a", "hello", max_tokens=4), chat_line("b", "hi", max_tokens=4)]
        file_id = await gw.upload(key, jsonl(lines))
        made = await _create(gw, key, file_id, {"anchor": "created_at", "seconds": 3600})
        assert made.status_code == 200, made.text
        done = await gw.wait(key, made.json()["id"])
        assert done["status"] == "completed"
        output = await gw.client.get(f"/v1/files/{done['output_file_id']}", headers=gw.auth(key))
        got = output.json()
        assert got["expires_at"] - got["created_at"] == 3600  # the file's own creation time
        upload = (await gw.client.get(f"/v1/files/{file_id}", headers=gw.auth(key))).json()
        assert upload["expires_at"] - upload["created_at"] == 30 * 86400  # the retention

        files = gw.services.files
        later = utcnow() + timedelta(seconds=3601)
        purged = await asyncio.to_thread(gw.client.blocking_portal.call, files.purge_expired, later)
        assert purged == 1
        gone = await gw.client.get(f"/v1/files/{done['output_file_id']}", headers=gw.auth(key))
        assert gone.status_code == 404
        kept = await gw.client.get(f"/v1/files/{file_id}", headers=gw.auth(key))
        assert kept.status_code == 200


async def test_output_expires_after_is_checked_like_openai(
    data_dir: Path, demo_model_dir: Path
) -> None:
    async with gateway(data_dir, demo_model_dir, embedded_jobs=False) as gw:
        _, key = await gw.tenant("acme")
        file_id = await gw.upload(key, jsonl([chat_line("a", "hello")]))
        wrong = [
            ({"anchor": "expires_at", "seconds": 3600}, "output_expires_after.anchor"),
            ({"seconds": 3600}, "output_expires_after.anchor"),
            ({"anchor": "created_at", "seconds": 3599}, "output_expires_after.seconds"),
            ({"anchor": "created_at", "seconds": 2_592_001}, "output_expires_after.seconds"),
            ({"anchor": "created_at", "seconds": "3600"}, "output_expires_after.seconds"),
            ({"anchor": "created_at"}, "output_expires_after.seconds"),
            ({"anchor": "created_at", "seconds": 3600, "x": 1}, "output_expires_after.x"),
        ]
        for expiry, param in wrong:
            refused = await _create(gw, key, file_id, expiry)
            assert refused.status_code == 400, (expiry, refused.text)
            error = refused.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", param)
        for seconds in (3600, 2_592_000):  # both bounds are allowed
            made = await _create(gw, key, file_id, {"anchor": "created_at", "seconds": seconds})
            assert made.status_code == 200, made.text
