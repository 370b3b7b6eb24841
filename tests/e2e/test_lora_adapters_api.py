"""LoRA adapters through the official `openai` client against a real `hydrant serve`.

Control-plane facts only: which names resolve for whom, what `/v1/models` lists, what the
ledger records and at which price. (The engine's side, what an adapter does to the
output, is tested in the engine's own tests.)
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
from hydrant_server import RunningServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform" / "adapters"))

from peft_dirs import write_adapter

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "Say something."}]
PRIVATE_PRICE = {"input_per_mtok": "2", "output_per_mtok": "3"}


def _openai(server: RunningServer, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=secret, max_retries=0)


@pytest.fixture(scope="module")
def tenants(
    server: RunningServer, demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, openai.OpenAI, openai.OpenAI]]:
    """Tenant A (its private adapter `demo:tuned`, priced) and tenant B; a public `demo:open`
    (no price of its own). Registered on the running server: no restart."""
    tenant_a, secret_a = server.tenant_key("lora-a")
    _, secret_b = server.tenant_key("lora-b")
    folder = tmp_path_factory.mktemp("adapters")
    with server.admin() as admin:
        private = admin.post(
            "/admin/models/demo/adapters",
            json={
                "name": "tuned",
                "path": str(write_adapter(folder / "tuned", demo_model_dir, r=8)),
                "tenant_id": tenant_a,
                "price": PRIVATE_PRICE,
            },
        )
        assert private.status_code == 201, private.text
        public = admin.post(
            "/admin/models/demo/adapters",
            json={"name": "open", "path": str(write_adapter(folder / "open", demo_model_dir))},
        )
        assert public.status_code == 201, public.text
    with _openai(server, secret_a) as a, _openai(server, secret_b) as b:
        yield tenant_a, a, b


def _ledger(server: RunningServer, request_id: str) -> tuple[str | None, str | None, Decimal]:
    """(adapter, its price-book model name, charged) of a request's ledger entry."""
    with sqlite3.connect(server.data_dir / "hydrant.db") as db:
        row = db.execute(
            "SELECT e.adapter, m.name, e.charged FROM ledger_entries e"
            " JOIN prices p ON p.id = e.price_id JOIN models m ON m.id = p.model_id"
            " WHERE e.request_id = ?",
            (request_id,),
        ).fetchone()
    assert row is not None, request_id
    return row[0], row[1], Decimal(str(row[2]))


def _charge(usage: openai.types.CompletionUsage, input_price: str, output_price: str) -> Decimal:
    cost = usage.prompt_tokens * Decimal(input_price) + usage.completion_tokens * Decimal(
        output_price
    )
    return (cost / Decimal(1_000_000)).quantize(Decimal("0.000001"))


def test_the_owner_calls_its_adapter_and_is_charged_its_price(
    server: RunningServer, tenants: tuple[str, openai.OpenAI, openai.OpenAI]
) -> None:
    _, a, _ = tenants
    for name in ("demo:tuned", "tuned"):  # `base:adapter`, or its name alone
        raw = a.chat.completions.with_raw_response.create(
            model=name, messages=MESSAGES, max_tokens=5, temperature=0
        )
        completion = raw.parse()
        assert completion.model == "demo:tuned" and completion.usage is not None
        adapter, priced_as, charged = _ledger(server, raw.headers["x-request-id"])
        assert (adapter, priced_as) == ("tuned", "demo:tuned")
        # Its cached-input price defaults to its input price: cache hits change nothing here.
        assert charged == _charge(completion.usage, "2", "3")
    # A public adapter with no price of its own: the base model's (the default 0.10 / 0.40).
    raw = a.completions.with_raw_response.create(model="demo:open", prompt="Hi", max_tokens=4)
    completion = raw.parse()
    assert completion.model == "demo:open" and completion.usage is not None
    adapter, priced_as, charged = _ledger(server, raw.headers["x-request-id"])
    assert (adapter, priced_as) == ("open", "demo")
    assert charged == _charge(completion.usage, "0.10", "0.40")
    # The base model itself: no adapter on its entry.
    raw = a.completions.with_raw_response.create(model="demo", prompt="Hi", max_tokens=4)
    assert _ledger(server, raw.headers["x-request-id"])[:2] == (None, "demo")


def test_another_tenant_gets_404_exactly_as_for_an_unknown_model(
    server: RunningServer, tenants: tuple[str, openai.OpenAI, openai.OpenAI]
) -> None:
    _, _, b = tenants
    answers = {}
    for name in ("demo:tuned", "tuned", "demo:no-such-adapter"):
        with pytest.raises(openai.NotFoundError) as info:
            b.chat.completions.create(model=name, messages=MESSAGES, max_tokens=2)
        body = info.value.body
        assert isinstance(body, dict)
        answers[name] = {**body, "message": body["message"].replace(name, "NAME")}
    assert answers["demo:tuned"] == answers["tuned"] == answers["demo:no-such-adapter"]
    assert answers["tuned"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        b.models.retrieve("demo:tuned")
    # B's public one works.
    assert b.completions.create(model="open", prompt="Hi", max_tokens=2).model == "demo:open"


def test_models_list_only_what_the_tenant_may_use(
    server: RunningServer, tenants: tuple[str, openai.OpenAI, openai.OpenAI]
) -> None:
    tenant_a, a, b = tenants
    listed_a = {m.id: m for m in a.models.list().data}
    assert set(listed_a) == {"demo", "demo:open", "demo:tuned"}
    assert listed_a["demo:tuned"].owned_by == tenant_a
    assert getattr(listed_a["demo:tuned"], "parent", None) == "demo"
    assert getattr(listed_a["demo"], "parent", None) is None
    assert {m.id for m in b.models.list().data} == {"demo", "demo:open"}
    # Retrieve: anonymous 401, another tenant 404 (above), the owner 200.
    anonymous = httpx.get(f"{server.base_url}/v1/models/demo:tuned", timeout=10)
    assert anonymous.status_code == 401
    card = a.models.retrieve("demo:tuned")
    assert (card.id, getattr(card, "parent", None)) == ("demo:tuned", "demo")


def test_a_removed_adapter_is_gone_at_once_and_can_come_back(
    server: RunningServer,
    tenants: tuple[str, openai.OpenAI, openai.OpenAI],
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    _, a, _ = tenants
    path = str(write_adapter(tmp_path / "brief", demo_model_dir))
    with server.admin() as admin:
        assert admin.post(
            "/admin/models/demo/adapters", json={"name": "brief", "path": path}
        ).is_success
        assert a.completions.create(model="demo:brief", prompt="Hi", max_tokens=2).model
        assert admin.delete("/admin/models/demo/adapters/brief").status_code == 204
    with pytest.raises(openai.NotFoundError):
        a.completions.create(model="demo:brief", prompt="Hi", max_tokens=2)
    assert "demo:brief" not in {m.id for m in a.models.list().data}


def _batch_file(a: openai.OpenAI, models: list[str]) -> str:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": MESSAGES, "max_tokens": 3},
        }
        for i, model in enumerate(models)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return a.files.create(file=("batch.jsonl", content), purpose="batch").id


def test_a_batch_runs_on_one_adapter_at_its_batch_price(
    server: RunningServer, tenants: tuple[str, openai.OpenAI, openai.OpenAI]
) -> None:
    _, a, _ = tenants
    mixed = a.batches.create(
        input_file_id=_batch_file(a, ["demo:tuned", "demo"]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert mixed.status == "failed" and mixed.errors is not None and mixed.errors.data
    assert mixed.errors.data[0].code == "mismatched_model"
    batch = a.batches.create(
        input_file_id=_batch_file(a, ["demo:tuned", "tuned"]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    deadline = time.monotonic() + 120
    while (batch := a.batches.retrieve(batch.id)).status not in ("completed", "failed"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
    assert batch.status == "completed" and batch.request_counts is not None
    assert batch.request_counts.completed == 2
    with sqlite3.connect(server.data_dir / "hydrant.db") as db:
        rows = db.execute(
            "SELECT adapter, input_tokens, output_tokens, charged FROM ledger_entries"
            " WHERE batch_id = ?",
            (batch.id,),
        ).fetchall()
    assert len(rows) == 2
    for adapter, input_tokens, output_tokens, charged in rows:
        # Half the adapter's own price (2 and 3 per million), a batch line's default.
        expected = (input_tokens * Decimal(1) + output_tokens * Decimal("1.5")) / 1_000_000
        assert adapter == "tuned"
        assert Decimal(str(charged)) == expected.quantize(Decimal("0.000001"))


def test_an_adapter_answers_through_the_api_as_transformers_with_it_merged(
    server: RunningServer,
    tenants: tuple[str, openai.OpenAI, openai.OpenAI],
    demo_model_dir: Path,
    tmp_path: Path,
) -> None:
    """The whole path at once: the gateway resolves the name and sends the adapter's path,
    the engine child loads it on first use and runs it in its batch. Greedy text equals
    transformers + peft with the adapter merged (`merge_and_unload`), an independent
    computation, and differs from the base model's (the adapter is strong enough to)."""
    import warnings

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from hydrant.engine.tokenizer import Tokenizer

    _, a, _ = tenants
    path = write_adapter(
        tmp_path / "strong", demo_model_dir, r=8, targets=("q_proj", "v_proj", "down_proj"), std=0.3
    )
    with server.admin() as admin:
        added = admin.post(
            "/admin/models/demo/adapters", json={"name": "strong", "path": str(path)}
        )
        assert added.status_code == 201, added.text
    prompt = "The river runs to the sea"
    tokenizer = Tokenizer.from_pretrained(demo_model_dir)
    ids = tokenizer.encode(prompt)
    tokens = 12

    def reference(merged: bool) -> str:
        model = AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
        if merged:
            with warnings.catch_warnings():  # peft 0.21 reads a deprecated transformers field
                warnings.filterwarnings("ignore", "`is_gradient_checkpointing`", FutureWarning)
                model = PeftModel.from_pretrained(model, str(path)).merge_and_unload().eval()
        out = list(ids)
        with torch.inference_mode():
            for _ in range(tokens):
                out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
        return tokenizer.decode(out[len(ids) :])

    def served(model: str) -> str:
        completion = a.completions.create(
            model=model,
            prompt=ids,
            max_tokens=tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert completion.usage is not None and completion.usage.completion_tokens == tokens
        return completion.choices[0].text

    with_adapter, base = served("demo:strong"), served("demo")
    assert with_adapter == reference(merged=True)
    assert base == reference(merged=False)
    assert with_adapter != base
