"""LoRA adapters on a worker pool, and through a hot swap of their base model (#28).

The gateway spawns its own `hydrant worker` (HYDRANT_POOL_SCALER=local). An adapter is
registered on the running gateway and called with the official `openai` client: the
gateway sends its path to the worker, which loads it on first use and reports it loaded
(what dispatch prefers); the ledger names it. Then the base model is hot-swapped: a
checkpoint the adapter does not fit is refused before any worker starts, and one it fits
keeps it: the new worker serves the adapter, with the same greedy answer as before.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import sys
from pathlib import Path

import openai
import pytest
from hydrant_server import RunningServer
from worker_stack import pool_env, pool_gateway, pools, redis_prefix, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "adapters"))

from peft_dirs import write_adapter

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(400)]

PROMPT = [{"role": "user", "content": "The river runs to the sea"}]


def _wider_checkpoint(demo: Path, out: Path) -> Path:
    """The demo model with a wider hidden and MLP size: a loadable checkpoint of the same
    architecture, written by transformers, that the demo's adapters do not fit."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads((demo / "config.json").read_text("utf-8"))
    config.update(hidden_size=192, intermediate_size=512)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo / name, out / name)
    return out


def _loaded(server: RunningServer) -> list[str]:
    """The adapters the pool's workers report loaded (their heartbeats, via /admin/engines)."""
    with server.admin() as admin:
        engines = admin.get("/admin/engines").json()["data"]
    return next(e["loaded_adapters"] for e in engines if e["model"] == "demo")


def _ledger_adapter(data_dir: Path, request_id: str) -> str | None:
    with sqlite3.connect(data_dir / "hydrant.db") as db:
        row = db.execute(
            "SELECT adapter FROM ledger_entries WHERE request_id = ?", (request_id,)
        ).fetchone()
    assert row is not None, request_id
    return row[0]


def test_a_pool_serves_an_adapter_and_a_hot_swap_keeps_it(
    demo_model_dir: Path, redis_url: str, data_dir: Path, tmp_path: Path
) -> None:
    v2 = tmp_path / "demo-v2"
    shutil.copytree(demo_model_dir, v2)
    wide = _wider_checkpoint(demo_model_dir, tmp_path / "demo-wide")
    adapter = write_adapter(
        tmp_path / "tuned", demo_model_dir, r=8, targets=("q_proj", "v_proj", "down_proj"), std=0.3
    )
    with redis_prefix(redis_url) as prefix:
        env = pool_env(redis_url, prefix, HYDRANT_POOL_SCALER="local")
        with pool_gateway(data_dir, demo_model_dir, env) as server:
            tenant, secret = server.tenant_key("lora-pool")
            with server.admin() as admin:
                added = admin.post(
                    "/admin/models/demo/adapters",
                    json={"name": "tuned", "path": str(adapter), "tenant_id": tenant},
                )
                assert added.status_code == 201, added.text
            client = openai.OpenAI(
                base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0, timeout=180
            )

            def ask(model: str) -> tuple[str, str]:
                raw = client.chat.completions.with_raw_response.create(
                    model=model, messages=PROMPT, max_tokens=12, temperature=0
                )
                completion = raw.parse()
                assert completion.model == (model if model.startswith("demo") else f"demo:{model}")
                return completion.choices[0].message.content or "", raw.headers["x-request-id"]

            base_text, _ = ask("demo")
            before, request_id = ask("demo:tuned")
            assert before != base_text  # the worker ran the adapter, not the base model
            assert _ledger_adapter(server.data_dir, request_id) == "tuned"
            wait_until(lambda: _loaded(server) == ["demo:tuned"], 30, "the worker to report it")

            with server.admin() as admin:
                admin.timeout = 300
                refused = admin.post("/admin/pools/demo/swap", json={"path": str(wide)})
                assert refused.status_code == 422, refused.text
                error = refused.json()["error"]
                assert (error["code"], error["param"]) == ("adapters_do_not_fit", "path")
                assert "tuned:" in error["message"] and "hidden_size" in error["message"]
                assert [w["path"] for w in pools(server)["workers"]] == [str(demo_model_dir)]

                swapped = admin.post("/admin/pools/demo/swap", json={"path": str(v2)})
                assert swapped.status_code == 200, swapped.text
            wait_until(
                lambda: [w["path"] for w in pools(server)["workers"]] == [str(v2)],
                60,
                "only the new checkpoint's worker",
            )
            assert _loaded(server) == []  # a fresh worker: nothing loaded yet
            after, request_id = ask("demo:tuned")
            assert after == before
            assert _ledger_adapter(server.data_dir, request_id) == "tuned"
            wait_until(lambda: _loaded(server) == ["demo:tuned"], 30, "the new worker to load it")
            assert ask("tuned")[0] == before  # by its name alone too

            # Without adapters that bind it, the model may change shape; new adapters are
            # then checked against the checkpoint it serves, not the one it started with.
            with server.admin() as admin:
                admin.timeout = 300
                assert admin.delete("/admin/models/demo/adapters/tuned").status_code == 204
                swapped = admin.post("/admin/pools/demo/swap", json={"path": str(wide)})
                assert swapped.status_code == 200, swapped.text
                old_shape = admin.post(
                    "/admin/models/demo/adapters", json={"name": "tuned", "path": str(adapter)}
                )
                assert old_shape.status_code == 422, old_shape.text
                assert "hidden_size" in old_shape.json()["error"]["message"]
                fits = write_adapter(tmp_path / "wide-tuned", wide, r=4, std=0.3)
                added = admin.post(
                    "/admin/models/demo/adapters", json={"name": "wide", "path": str(fits)}
                )
                assert added.status_code == 201, added.text
            assert ask("demo:wide")[0]
