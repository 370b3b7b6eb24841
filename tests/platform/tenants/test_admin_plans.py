"""`/admin/plans`: limits and budgets round-trip exactly, and reach the principal of a request."""

from __future__ import annotations

from decimal import Decimal

from control_plane_helpers import ControlPlane, bearer

GOLD = {
    "name": "gold",
    "free_below_tokens": 256,
    "limited_up_to_tokens": 4096,
    "requests_per_minute": 600,
    "tokens_per_minute": 1_000_000,
    "max_concurrent_requests": 8,
    "tokens_per_day": 50_000_000,
    "spend_per_day": "100",
    "spend_per_month": "2500.123456",
    "fair_share_weight": 2.5,
    "allowed_models": ["llama3", "qwen", "llama3"],
}


async def test_default_plan_has_the_field_defaults(cp: ControlPlane) -> None:
    plan = (await cp.client.get("/admin/plans/pln_default", headers=cp.admin)).json()
    assert plan["name"] == "default"
    assert (plan["free_below_tokens"], plan["limited_up_to_tokens"]) == (512, 2048)
    assert (plan["limited_requests_per_s"], plan["long_queue_timeout_s"]) == (10, 30)
    assert plan["max_prompt_tokens"] == 8192
    assert plan["requests_per_minute"] is None and plan["spend_per_day"] is None
    assert plan["allowed_models"] is None and plan["fair_share_weight"] == "1.0"


async def test_create_round_trips_exact_values(cp: ControlPlane) -> None:
    response = await cp.client.post("/admin/plans", json=GOLD, headers=cp.admin)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["spend_per_day"] == "100.000000"
    assert plan["spend_per_month"] == "2500.123456"
    assert plan["fair_share_weight"] == "2.5"
    assert plan["allowed_models"] == ["llama3", "qwen"]
    listed = (await cp.client.get("/admin/plans", headers=cp.admin)).json()["data"]
    assert {p["name"] for p in listed} == {"default", "gold"}


async def test_money_must_not_be_a_float_and_must_fit(cp: ControlPlane) -> None:
    cases = [
        ({"spend_per_day": 100.5}, "float"),
        ({"spend_per_day": "1.1234567"}, "decimal places"),
        ({"spend_per_day": "-1"}, None),
        ({"fair_share_weight": 0}, "positive"),
        ({"free_below_tokens": 5000}, "must not exceed"),
        ({"requests_per_minute": -1}, None),
        ({"allowed_models": [""]}, None),
        ({"rpm": 5}, None),
    ]
    for extra, message in cases:
        response = await cp.client.post(
            "/admin/plans", json={"name": "x", **extra}, headers=cp.admin
        )
        assert response.status_code == 400, (extra, response.text)
        if message is not None:
            assert message in response.json()["error"]["message"], extra
    duplicate = await cp.client.post("/admin/plans", json={"name": "default"}, headers=cp.admin)
    assert duplicate.status_code == 409


async def test_plan_reaches_the_principal_and_updates_apply(cp: ControlPlane) -> None:
    gold = (await cp.client.post("/admin/plans", json=GOLD, headers=cp.admin)).json()
    tenant = await cp.create_tenant("acme", plan="gold", timezone="Europe/Paris")
    _, secret = await cp.create_key(tenant["id"])

    async def principal() -> object:
        return await cp.authenticator.authenticate(f"Bearer {secret}", "inference")

    first = await cp.in_app(principal)
    assert first.plan_id == gold["id"] and first.weight == 2.5  # type: ignore[attr-defined]
    assert first.allowed_models == frozenset({"llama3", "qwen"})  # type: ignore[attr-defined]
    assert first.timezone == "Europe/Paris"  # type: ignore[attr-defined]
    policy = first.plan  # type: ignore[attr-defined]
    assert policy.tiers.free_below == 256 and policy.tiers.limited_up_to == 4096
    assert policy.spend_per_month == Decimal("2500.123456")
    assert policy.requests_per_minute == 600

    response = await cp.client.patch(
        f"/admin/plans/{gold['id']}",
        json={"requests_per_minute": None, "allowed_models": None, "spend_per_day": "5"},
        headers=cp.admin,
    )
    assert response.status_code == 200, response.text
    assert response.json()["spend_per_day"] == "5.000000"
    second = await cp.in_app(principal)  # this node dropped its cache: new limits at once
    assert second.plan.requests_per_minute is None  # type: ignore[attr-defined]
    assert second.allowed_models is None  # type: ignore[attr-defined]
    account = (await cp.client.get("/account", headers=bearer(secret))).json()
    assert account["plan"]["spend_per_day"] == "5.000000"
    bad = await cp.client.patch(
        f"/admin/plans/{gold['id']}", json={"limited_up_to_tokens": 100}, headers=cp.admin
    )
    assert bad.status_code == 400
