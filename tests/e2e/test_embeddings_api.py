"""`POST /v1/embeddings` through the official `openai` client, against a real server.

Each vector must equal transformers' last hidden state of the input's last token (the
demo model read back from its files), normalized; the client's default base64 answer
must decode to exactly the float answer; and the request must be metered like any
other: input tokens only, one ledger entry, charged at the model's input price.
"""

from __future__ import annotations

import math
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from hydrant_server import RunningServer, tenant_client

from hydrant.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

TEXTS = ["Rivers run to the sea.", "A short one", "Oslo"]


@pytest.fixture(scope="module")
def tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(demo_model_dir)


@pytest.fixture(scope="module")
def reference(demo_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(demo_model_dir, dtype=torch.float32).eval()


def _expected(reference: Any, ids: list[int]) -> list[float]:
    with torch.inference_mode():
        hidden = reference.model(torch.tensor([ids])).last_hidden_state[0, -1].float()
    return torch.nn.functional.normalize(hidden, dim=0).tolist()


def _distance(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def _input_price(server: RunningServer, model: str) -> tuple[Decimal, Decimal]:
    """(input, cached input) per million tokens of the model's current price."""
    with server.admin() as admin:
        models = admin.get("/admin/models").json()["data"]
        (deployment,) = [m for m in models if m["name"] == model]
        prices = admin.get(f"/admin/models/{deployment['id']}/prices").json()["data"]
    latest = max(prices, key=lambda p: p["effective_from"])
    return Decimal(latest["input_per_mtok"]), Decimal(latest["cached_input_per_mtok"])


def test_vectors_equal_transformers_and_are_billed_as_input(
    server: RunningServer, client: openai.OpenAI, tokenizer: Tokenizer, reference: Any
) -> None:
    raw = client.embeddings.with_raw_response.create(
        model="demo", input=TEXTS, encoding_format="float"
    )
    floats = raw.parse()
    ids = [tokenizer.encode(text) for text in TEXTS]
    assert floats.object == "list" and floats.model == "demo"
    assert [d.index for d in floats.data] == [0, 1, 2]
    for item, prompt in zip(floats.data, ids, strict=True):
        assert item.object == "embedding"
        assert _distance(item.embedding, _expected(reference, prompt)) < 1e-4
    assert floats.usage.prompt_tokens == sum(len(p) for p in ids)
    assert floats.usage.total_tokens == floats.usage.prompt_tokens
    entry = server.ledger_entry(raw.headers["x-request-id"])
    assert entry is not None
    status, input_tokens, cached, output_tokens, charged = entry
    assert (status, input_tokens, output_tokens) == ("finished", floats.usage.prompt_tokens, 0)
    price, cached_price = _input_price(server, "demo")
    hits = Decimal(str(cached))  # the prefix cache's tokens are billed at their own price
    expected = (Decimal(str(input_tokens)) - hits) * price + hits * cached_price
    expected /= 10**6
    assert Decimal(str(charged)) == expected.quantize(Decimal("0.000001"))
    # The client's default: base64 float32, decoded by the client; the same vectors (to
    # float rounding: another call may batch the inputs into other steps).
    default = client.embeddings.create(model="demo", input=TEXTS)
    _same(default, floats)
    # Token ids are inputs too, one list or several.
    _same(client.embeddings.create(model="demo", input=ids, encoding_format="float"), floats)
    one = client.embeddings.create(model="demo", input=ids[2], encoding_format="float")
    assert len(one.data) == 1
    assert _distance(one.data[0].embedding, floats.data[2].embedding) < 1e-5


def _same(got: Any, want: Any) -> None:
    assert len(got.data) == len(want.data)
    for a, b in zip(got.data, want.data, strict=True):
        assert _distance(a.embedding, b.embedding) < 1e-5


def test_an_input_may_fill_the_context(server: RunningServer, client: openai.OpenAI) -> None:
    with server.admin() as admin:
        engines = admin.get("/admin/engines").json()["data"]
    (demo,) = [e for e in engines if e["model"] == "demo"]
    length = int(demo["max_model_len"])
    full = client.embeddings.create(model="demo", input=[5] * length, encoding_format="float")
    assert full.usage.prompt_tokens == length and len(full.data) == 1
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.embeddings.create(model="demo", input=[5] * (length + 1))
    assert refused.value.code == "context_length_exceeded"
    # vLLM's truncate_prompt_tokens: -1 keeps the context's worth of each input's end.
    cut = client.embeddings.create(
        model="demo",
        input=[[5] * (length + 7), [6, 7]],
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": -1},
    )
    assert cut.usage.prompt_tokens == length + 2
    _same(cut, client.embeddings.create(model="demo", input=[[5] * length, [6, 7]]))


def test_truncation_keeps_each_inputs_end(
    client: openai.OpenAI, tokenizer: Tokenizer, reference: Any
) -> None:
    """The last token is the one pooled, so the end is what a cut must keep."""
    cut = client.embeddings.create(
        model="demo",
        input=TEXTS[:2],
        encoding_format="float",
        extra_body={"truncate_prompt_tokens": 3},
    )
    ids = [tokenizer.encode(text)[-3:] for text in TEXTS[:2]]
    assert cut.usage.prompt_tokens == 6
    for item, tail in zip(cut.data, ids, strict=True):
        assert _distance(item.embedding, _expected(reference, tail)) < 1e-4


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["a", ""]}, "input"),
        ({"input": ["a", [1, 2]]}, "input"),
        ({"input": [[10**9]]}, "input"),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "dimensions": 16}, "dimensions"),  # not a Matryoshka model
        ({"input": ["a"] * 2049}, "input"),
        ({"input": 5}, "input"),
        ({"input": "a", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"input": "a", "truncate_prompt_tokens": 10**7}, "truncate_prompt_tokens"),
    ],
)
def test_bad_input_is_a_clear_400(
    server: RunningServer, client: openai.OpenAI, request_body: dict[str, Any], param: str
) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/embeddings",
        json={"model": "demo", **request_body},
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_a_bare_decoder_model_serves_embeddings_only(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The demo model saved as its bare decoder (`LlamaModel`: no LM head, names without
    `model.`), the way embedding models ship: the server starts, embeds as transformers'
    `AutoModel` does, and answers a chat request with a 400 naming the model."""
    from transformers import AutoModel

    target = tmp_path_factory.mktemp("bare") / "model"
    bare = AutoModel.from_pretrained(demo_model_dir, dtype=torch.float32).eval()
    bare.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(demo_model_dir / name, target / name)
    ids = Tokenizer.from_pretrained(target).encode(TEXTS[0])
    with tenant_client(tmp_path_factory.mktemp("serve"), target, "embedder") as client:
        vector = client.embeddings.create(model="demo", input=TEXTS[0]).data[0].embedding
        with torch.inference_mode():
            hidden = bare(torch.tensor([ids])).last_hidden_state[0, -1]
        expected = torch.nn.functional.normalize(hidden, dim=0).tolist()
        assert _distance(vector, expected) < 1e-4
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert refused.value.param == "model" and "embeddings only" in refused.value.message


def _post(server: RunningServer, client: openai.OpenAI, path: str, body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}{path}",
        json={"model": "demo", **body},
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=60,
    )


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_score_is_the_cosine_of_each_pairs_embeddings(
    server: RunningServer, client: openai.OpenAI, tokenizer: Tokenizer, reference: Any
) -> None:
    """vLLM's /v1/score for an embedding model, against transformers' vectors; `text_1`
    shared by every pair is embedded (and billed) once."""
    ids = {text: tokenizer.encode(text) for text in TEXTS}
    want = {text: _expected(reference, ids[text]) for text in TEXTS}
    one_to_many = _post(server, client, "/v1/score", {"text_1": TEXTS[0], "text_2": TEXTS})
    assert one_to_many.status_code == 200, one_to_many.text
    body = one_to_many.json()
    assert body["object"] == "list" and body["model"] == "demo"
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for item, text in zip(body["data"], TEXTS, strict=True):
        assert item["object"] == "score"
        assert abs(item["score"] - _cosine(want[TEXTS[0]], want[text])) < 1e-4
    assert abs(body["data"][0]["score"] - 1.0) < 1e-4  # a text against itself
    billed = sum(len(ids[t]) for t in TEXTS) + len(ids[TEXTS[0]])
    assert body["usage"] == {"prompt_tokens": billed, "total_tokens": billed}
    entry = server.ledger_entry(one_to_many.headers["x-request-id"])
    assert entry is not None and entry[:4:3] == ("finished", 0) and entry[1] == billed
    pairwise = _post(
        server, client, "/v1/score", {"text_1": TEXTS[:2], "text_2": [TEXTS[2], TEXTS[0]]}
    ).json()
    expected = [_cosine(want[TEXTS[0]], want[TEXTS[2]]), _cosine(want[TEXTS[1]], want[TEXTS[0]])]
    assert all(abs(d["score"] - e) < 1e-4 for d, e in zip(pairwise["data"], expected, strict=True))


def test_rerank_orders_documents_by_relevance(
    server: RunningServer, client: openai.OpenAI, tokenizer: Tokenizer, reference: Any
) -> None:
    query = "Where do rivers go?"
    documents = [*TEXTS, query]  # the query itself must come first
    want = _expected(reference, tokenizer.encode(query))
    scores = [_cosine(want, _expected(reference, tokenizer.encode(d))) for d in documents]
    ranked = _post(server, client, "/v1/rerank", {"query": query, "documents": documents})
    assert ranked.status_code == 200, ranked.text
    results = ranked.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents)))
    assert [r["index"] for r in results] == sorted(range(len(documents)), key=lambda i: -scores[i])
    assert results[0]["index"] == 3
    for result in results:
        assert abs(result["relevance_score"] - scores[result["index"]]) < 1e-4
        assert result["document"] == {"text": documents[result["index"]]}
    top = _post(
        server,
        client,
        "/v1/rerank",
        {"query": query, "documents": documents, "top_n": 2, "return_documents": False},
    ).json()
    assert [r["index"] for r in top["results"]] == [r["index"] for r in results[:2]]
    assert all(r["document"] is None for r in top["results"])
    tokens = sum(len(tokenizer.encode(t)) for t in [query, *documents])
    assert top["usage"]["total_tokens"] == tokens


def test_vllms_other_paths_answer_the_same(server: RunningServer, client: openai.OpenAI) -> None:
    """`/score`, `/rerank` and Cohere's `/v2/rerank`, as vLLM serves them, with a tenant key."""
    query = {"query": "Where do rivers go?", "documents": TEXTS}
    ranked = _post(server, client, "/v1/rerank", query).json()["results"]
    for path in ("/rerank", "/v2/rerank"):
        again = _post(server, client, path, query)
        assert again.status_code == 200, again.text
        results = again.json()["results"]
        assert [r["index"] for r in results] == [r["index"] for r in ranked]
        for a, b in zip(results, ranked, strict=True):
            assert abs(a["relevance_score"] - b["relevance_score"]) < 1e-5
    pair = {"text_1": TEXTS[0], "text_2": TEXTS[1]}
    scored = _post(server, client, "/v1/score", pair).json()["data"][0]["score"]
    assert abs(_post(server, client, "/score", pair).json()["data"][0]["score"] - scored) < 1e-5
    anonymous = httpx.post(f"{server.base_url}/v2/rerank", json={"model": "demo", **query})
    assert anonymous.status_code == 401


@pytest.mark.parametrize(
    ("path", "request_body", "param"),
    [
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
        ("/v1/score", {"text_1": [], "text_2": "a"}, "text_1"),
        ("/v1/score", {"text_1": "a", "text_2": ["b", ""]}, "text_2"),
        ("/v1/score", {"text_1": "a"}, "text_2"),
        (
            "/v1/score",
            {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 0},
            "truncate_prompt_tokens",
        ),
        ("/v1/rerank", {"query": "a", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "", "documents": ["a"]}, "query"),
        ("/v1/rerank", {"query": "a", "documents": ["a"], "top_n": 0}, "top_n"),
        ("/v1/rerank", {"query": "a", "documents": [1, 2]}, "documents"),
        ("/v1/rerank", {"query": "a", "documents": ["a"] * 2048}, "documents"),
    ],
)
def test_bad_score_and_rerank_requests_are_clear_400s(
    server: RunningServer, client: openai.OpenAI, path: str, request_body: Any, param: str
) -> None:
    response = _post(server, client, path, request_body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
