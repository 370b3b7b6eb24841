"""Two gateway processes on one Redis and one PostgreSQL: limits and budgets hold across both.

50 concurrent clients, spread over both gateways, against one tenant with a
tight plan. If either limit were counted per process, each gateway would let
its own share through and the total would exceed the plan; it must not by even
one request. The ledger (one PostgreSQL, written by both) is the witness.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from decimal import Decimal
from pathlib import Path

import asyncpg
import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server

from hydrant.platform.db import migrate
from hydrant.platform.db.session import Database
from hydrant.platform.keys import generate_key
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.services import build_services
from hydrant.settings import ModelSpec, Settings

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]

CLIENTS = 50
RPM = 20
BUDGET = Decimal("0.2")
# Prices that make one short request cost cents, so a budget of cents binds after a few.
INPUT_PER_MTOK, CACHED_PER_MTOK, OUTPUT_PER_MTOK = Decimal(1000), Decimal(500), Decimal(4000)
MAX_TOKENS = 2
BODY = {
    "model": "demo",
    "messages": [{"role": "user", "content": "Say one word."}],
    "max_tokens": MAX_TOKENS,
    "temperature": 0,
}


def _dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg", "postgresql", 1)


async def _admin_sql(postgres_server: str, sql: str) -> None:
    connection = await asyncpg.connect(_dsn(postgres_server) + "/postgres")
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


@pytest.fixture(scope="module")
def shared_database(postgres_server: str) -> Iterator[str]:
    """One migrated database for both gateways (module scope: they start once)."""
    name = f"hydrant_t_{secrets.token_hex(6)}"
    asyncio.run(_admin_sql(postgres_server, f'CREATE DATABASE "{name}"'))
    try:
        url = f"{postgres_server}/{name}"
        migrate.upgrade(url)
        yield url
    finally:
        asyncio.run(_admin_sql(postgres_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="module")
def gateways(
    shared_database: str,
    redis_url: str,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[RunningServer]]:
    """Two gateways sharing the database, Redis, the server secret and the admin key.

    Started together, as a deployment's replicas are (they may race to create the
    model's row and price: `test_gateways_starting_together_all_load_prices`).
    """
    env = {
        "HYDRANT_DATABASE_URL": shared_database,
        "HYDRANT_REDIS_URL": redis_url,
        "HYDRANT_AUTO_MIGRATE": "false",
        "HYDRANT_SECRET_KEY": generate_key("test").secret,
        "HYDRANT_PRICE_INPUT_PER_MTOK": str(INPUT_PER_MTOK),
        "HYDRANT_PRICE_CACHED_INPUT_PER_MTOK": str(CACHED_PER_MTOK),
        "HYDRANT_PRICE_OUTPUT_PER_MTOK": str(OUTPUT_PER_MTOK),
    }
    admin_key = generate_key("test").secret
    managers = [
        hydrant_server(
            tmp_path_factory.mktemp(f"gateway{i}"), demo_model_dir, env, admin_key=admin_key
        )
        for i in range(2)
    ]
    with ExitStack() as stack:
        with ThreadPoolExecutor(2) as pool:
            futures = [(pool.submit(m.__enter__), m) for m in managers]
        servers, errors = [], []
        for future, manager in futures:
            try:
                servers.append(future.result())
                stack.push(manager.__exit__)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        yield servers


async def _ledger(url: str, tenant_id: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(_dsn(url))
    try:
        return await connection.fetch(
            "SELECT request_id, input_tokens, cached_tokens, output_tokens, charged"
            " FROM ledger_entries WHERE tenant_id = $1",
            tenant_id,
        )
    finally:
        await connection.close()


async def ledger_for(url: str, tenant_id: str, expected: set[str]) -> list[asyncpg.Record]:
    """The tenant's rows once every expected request id is there (or after 15 s)."""
    deadline = time.monotonic() + 15
    while True:
        rows = await _ledger(url, tenant_id)
        if expected <= {r["request_id"] for r in rows} or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.2)


async def storm(
    gateways: list[RunningServer], key: str, per_client: int, stop_on_refusal: bool
) -> list[tuple[int, httpx.Response]]:
    """`CLIENTS` concurrent clients, alternating between the gateways: (gateway, response)."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    clients = [
        httpx.AsyncClient(base_url=g.base_url, headers=headers, timeout=120, limits=limits)
        for g in gateways
    ]
    start = asyncio.Event()

    async def client(number: int) -> list[tuple[int, httpx.Response]]:
        which = number % len(clients)
        got = []
        await start.wait()
        for _ in range(per_client):
            response = await clients[which].post("/v1/chat/completions", json=BODY)
            got.append((which, response))
            if stop_on_refusal and response.status_code != 200:
                break
        return got

    try:
        tasks = [asyncio.create_task(client(n)) for n in range(CLIENTS)]
        await asyncio.sleep(0.05)
        start.set()
        return [item for batch in await asyncio.gather(*tasks) for item in batch]
    finally:
        for c in clients:
            await c.aclose()


def check_refusal(response: httpx.Response, code: str, type_: str, words: str) -> None:
    """A 429 with `Retry-After` and an OpenAI error body that names the limit."""
    assert response.status_code == 429, response.text
    assert int(response.headers["retry-after"]) >= 1
    error = response.json()["error"]
    assert error["code"] == code
    assert error["type"] == type_
    assert words in error["message"]
    assert response.headers["x-request-id"].startswith("req_")


async def test_requests_per_minute_hold_across_gateways(
    gateways: list[RunningServer], shared_database: str
) -> None:
    plan = gateways[0].create_plan(f"rpm-{secrets.token_hex(3)}", requests_per_minute=RPM)
    tenant_id, key = gateways[1].tenant_key("rpm-tenant", plan=plan)
    results = await storm(gateways, key, per_client=2, stop_on_refusal=False)

    assert len(results) == 2 * CLIENTS  # 100 asked, 50 of them on each gateway
    assert sum(1 for which, _ in results if which == 0) == CLIENTS
    ok = [r for _, r in results if r.status_code == 200]
    assert len(ok) == RPM  # exactly the limit: not one more, though each gateway saw 50
    for _, response in results:
        if response.status_code != 200:
            check_refusal(response, "tenant_rpm", "rate_limit_error", "requests per minute")
            assert f"limit {RPM}" in response.json()["error"]["message"]

    served = {r.headers["x-request-id"] for r in ok}
    rows = await ledger_for(shared_database, tenant_id, served)
    assert {r["request_id"] for r in rows} == served  # refusals leave no ledger entry


async def test_spend_budget_holds_across_gateways(
    gateways: list[RunningServer], shared_database: str
) -> None:
    plan = gateways[1].create_plan(f"budget-{secrets.token_hex(3)}", spend_per_day=str(BUDGET))
    tenant_id, key = gateways[0].tenant_key("budget-tenant", plan=plan)
    # Each client keeps asking until it is refused: demand far beyond the budget.
    results = await storm(gateways, key, per_client=4, stop_on_refusal=True)

    ok = [r for _, r in results if r.status_code == 200]
    refused = [r for _, r in results if r.status_code != 200]
    assert ok and refused
    for response in refused:
        check_refusal(response, "spend_day", "insufficient_quota", "daily spend budget")

    served = {r.headers["x-request-id"] for r in ok}
    rows = await ledger_for(shared_database, tenant_id, served)
    assert {r["request_id"] for r in rows} == served
    charged = sum((Decimal(r["charged"]) for r in rows), Decimal(0))
    assert 0 < charged <= BUDGET  # both gateways together never overspend
    # Nor do they refuse early: a refusal means the admitted requests' maximum cost
    # (prompt + max_tokens at the price) plus one more no longer fitted the budget.
    prompt_tokens = {r["input_tokens"] for r in rows}
    assert len(prompt_tokens) == 1
    per_million = prompt_tokens.pop() * INPUT_PER_MTOK + MAX_TOKENS * OUTPUT_PER_MTOK
    reserve = per_million / Decimal(1_000_000)
    assert (len(ok) + 1) * reserve > BUDGET


async def test_gateways_starting_together_all_load_prices(
    fresh_postgres_url: str, tmp_path: Path
) -> None:
    """On an empty database, starting gateways race to create the model's row and price.

    The loser's insert fails; it must still load the price book at start, or it
    would admit requests with no price, so spend budgets would not bind on it.
    """
    await asyncio.to_thread(migrate.upgrade, fresh_postgres_url)
    databases = [Database(fresh_postgres_url) for _ in range(3)]
    gateways = [
        build_services(
            Settings(
                data_dir=tmp_path / f"g{i}",
                database_url=fresh_postgres_url,
                models=(ModelSpec("demo", tmp_path / "model"),),
            ),
            database=database,
            registry=ModelRegistry(),
        )
        for i, database in enumerate(databases)
    ]
    try:
        await asyncio.gather(*(g.start() for g in gateways))
        prices = [g.inference.prices("demo") if g.inference else None for g in gateways]
        assert [p is not None for p in prices] == [True] * len(gateways)
    finally:
        for gateway in gateways:
            await gateway.stop()  # disposes its database too


CREDIT_PROMO, CREDIT_PAID = Decimal("0.05"), Decimal("0.15")


async def _credit_applications(url: str, tenant_id: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(_dsn(url))
    try:
        return await connection.fetch(
            "SELECT request_id, grant_id, amount FROM credit_applications WHERE tenant_id = $1",
            tenant_id,
        )
    finally:
        await connection.close()


async def test_prepaid_credits_hold_across_gateways(
    gateways: list[RunningServer], shared_database: str
) -> None:
    """50 clients over both gateways against a prepaid tenant with a small balance: the
    balance never goes below zero, refusals are OpenAI's `insufficient_quota`, and what
    the grants paid equals the ledger's sum, to the micro-unit."""
    plan = gateways[0].create_plan(f"prepaid-{secrets.token_hex(3)}", prepaid=True)
    tenant_id, key = gateways[1].tenant_key("prepaid-tenant", plan=plan)
    with gateways[0].admin() as admin:
        for kind, amount in (("paid", CREDIT_PAID), ("promo", CREDIT_PROMO)):
            granted = admin.post(
                f"/admin/tenants/{tenant_id}/credits", json={"kind": kind, "amount": str(amount)}
            )
            assert granted.status_code == 201, granted.text
    results = await storm(gateways, key, per_client=4, stop_on_refusal=True)

    ok = [r for _, r in results if r.status_code == 200]
    refused = [r for _, r in results if r.status_code != 200]
    assert ok and refused
    for response in refused:
        assert response.status_code == 429, response.text
        error = response.json()["error"]
        assert (error["code"], error["type"]) == ("insufficient_quota", "insufficient_quota")
        assert "prepaid balance is" in error["message"]

    served = {r.headers["x-request-id"] for r in ok}
    rows = await ledger_for(shared_database, tenant_id, served)
    assert {r["request_id"] for r in rows} == served
    charged = sum((Decimal(r["charged"]) for r in rows), Decimal(0))
    assert 0 < charged <= CREDIT_PROMO + CREDIT_PAID  # never overdrawn across both gateways

    with httpx.Client(
        base_url=gateways[0].base_url, headers={"Authorization": f"Bearer {key}"}
    ) as tenant:
        balance = tenant.get("/account/balance").json()  # pays any entry not yet applied
    assert Decimal(balance["available"]) == CREDIT_PROMO + CREDIT_PAID - charged >= 0
    applications = await _credit_applications(shared_database, tenant_id)
    assert all(a["grant_id"] is not None for a in applications)  # nothing went unpaid
    assert sum((Decimal(a["amount"]) for a in applications), Decimal(0)) == charged
    assert {a["request_id"] for a in applications} == served
    by_kind = {g["kind"]: Decimal(g["used"]) for g in balance["grants"]}
    assert by_kind["promo"] == min(charged, CREDIT_PROMO)  # promo money is spent first
