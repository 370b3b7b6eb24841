"""The Responses API's store on the embedded SQLite and on PostgreSQL: a tenant's answers
only, the chain a follow-up continues, expiry (never read; the periodic job deletes), a
database that refuses a write (the answer is returned, marked as not stored), and answers
sealed at rest (nothing of the conversation in the row; another server secret, or a blob
moved to another row, reads as absent; rows from before sealing still read)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from hydrant.platform.db.base import utcnow
from hydrant.platform.db.models import StoredResponse, Tenant
from hydrant.platform.db.session import Database
from hydrant.platform.errors import InvalidRequest, NotFound, ServiceUnavailable
from hydrant.platform.inference.responses.seal import ResponseSealer
from hydrant.platform.inference.responses.store import ResponseStore, input_items
from hydrant.platform.inference.responses.tasks import PURGE_RESPONSES
from hydrant.platform.job_table import JOB_TABLE, PERIODIC
from hydrant.platform.jobs.context import JobContext
from hydrant.settings import load_settings


def _answer(response_id: str, text: str) -> dict[str, Any]:
    message = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }
    return {"id": response_id, "model": "demo", "output": [message]}


SEALER = ResponseSealer(lambda: b"s" * 32)


def _store(database: Database, days: int = 30, sealer: ResponseSealer = SEALER) -> ResponseStore:
    return ResponseStore(database, days, sealer)


@pytest.fixture()
async def tenants(db: Database) -> Database:
    async with db.session() as session:
        session.add_all([Tenant(id="ten_a", name="a"), Tenant(id="ten_b", name="b")])
    return db


async def test_a_tenants_answers_form_a_chain_no_one_else_reads(tenants: Database) -> None:
    store = _store(tenants, days=30)
    first = input_items("Rivers?")
    assert await store.save("ten_a", _answer("resp_1", "Many."), first)
    history = await store.history("ten_a", "resp_1")
    assert [i["role"] for i in history] == ["user", "assistant"]
    assert history[0]["content"] == [{"type": "input_text", "text": "Rivers?"}]
    assert history[0]["id"].startswith("msg_")
    second = [*history, *input_items("Lakes?")]
    assert await store.save("ten_a", _answer("resp_2", "Some."), second)
    chain = await store.history("ten_a", "resp_2")
    assert [i["role"] for i in chain] == ["user", "assistant", "user", "assistant"]
    for tenant in ("ten_b", None):  # another tenant, or an admin key: as if absent
        with pytest.raises(NotFound) as missing:
            await store.history(tenant, "resp_1")
        assert missing.value.param == "previous_response_id"
        with pytest.raises(NotFound):
            await store.delete(tenant, "resp_1")
    await store.delete("ten_a", "resp_1")
    with pytest.raises(NotFound):
        await store.get("ten_a", "resp_1")
    assert (await store.get("ten_a", "resp_2")).body["output"][0]["role"] == "assistant"


async def test_expired_answers_are_never_read_and_the_purge_job_deletes_them(
    tenants: Database,
) -> None:
    store = _store(tenants, days=1)
    await store.save("ten_a", _answer("resp_old", "x"), input_items("a"))
    await store.save("ten_a", _answer("resp_new", "y"), input_items("b"))
    async with tenants.session() as session:
        past = utcnow() - timedelta(seconds=1)
        await session.execute(
            update(StoredResponse).where(StoredResponse.id == "resp_old").values(expires_at=past)
        )
    with pytest.raises(NotFound):
        await store.get("ten_a", "resp_old")
    job = JOB_TABLE.job_named(PURGE_RESPONSES)
    assert any(p.job == PURGE_RESPONSES and p.embedded for p in PERIODIC)
    context = JobContext(load_settings({}), tenants, None, lambda *_: None)  # type: ignore[arg-type]
    assert await job.fn(context) == {"deleted": 1}
    async with tenants.session() as session:
        ids = (await session.scalars(select(StoredResponse.id))).all()
    assert ids == ["resp_new"]


async def test_nothing_is_stored_when_the_days_are_zero(tenants: Database) -> None:
    store = _store(tenants, days=0)
    assert not store.enabled
    with pytest.raises(InvalidRequest) as refused:
        await store.history("ten_a", "resp_1")
    assert refused.value.param == "previous_response_id"


async def test_a_refused_write_returns_false_and_logs_no_content(
    tenants: Database, caplog: pytest.LogCaptureFixture
) -> None:
    store = _store(tenants, days=30)
    # An unknown tenant breaks the foreign key: the database refuses the row.
    caplog.set_level("WARNING")
    kept = await store.save(
        "ten_missing", _answer("resp_x", "secret answer"), input_items("secret prompt")
    )
    async with tenants.session() as session:
        count = await session.scalar(select(func.count()).select_from(StoredResponse))
    if kept:  # SQLite enforces foreign keys only with its pragma on
        pytest.skip("this backend accepted the row")
    assert count == 0
    (record,) = [r for r in caplog.records if r.getMessage() == "a response could not be stored"]
    assert record.error == "IntegrityError" and record.exc_info is None  # type: ignore[attr-defined]
    assert "secret" not in caplog.text and "secret" not in repr(vars(record))


async def test_a_database_outage_is_a_503_to_retry() -> None:
    """Nothing listens on port 1: every read of the store is the client's 503, not a 500,
    and a write gives the answer back marked as not stored."""
    down = Database("postgresql+asyncpg://hydrant@127.0.0.1:1/none")
    store = _store(down, days=30)
    try:
        for attempt in (store.get("ten_a", "resp_1"), store.history("ten_a", "resp_1")):
            with pytest.raises(ServiceUnavailable):
                await attempt
        with pytest.raises(ServiceUnavailable):
            await store.delete("ten_a", "resp_1")
        assert not await store.save("ten_a", _answer("resp_2", "x"), input_items("y"))
    finally:
        await down.dispose()


async def test_the_row_holds_nothing_of_the_conversation(tenants: Database) -> None:
    store = _store(tenants)
    await store.save("ten_a", _answer("resp_1", "herons nest high"), input_items("kestrel-7731?"))
    async with tenants.session() as session:
        row = await session.scalar(select(StoredResponse).where(StoredResponse.id == "resp_1"))
    assert row is not None and row.sealed is not None
    assert row.input_items is None and row.body is None
    for word in (b"kestrel", b"herons", "kestrel".encode("utf-16-le")):
        assert word not in bytes(row.sealed)
    answer = await store.get("ten_a", "resp_1")
    assert answer.input_items[0]["content"][0]["text"] == "kestrel-7731?"
    assert answer.body["output"][0]["content"][0]["text"] == "herons nest high"


async def test_another_server_secret_reads_as_absent_and_the_tenant_can_still_delete(
    tenants: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await _store(tenants).save("ten_a", _answer("resp_1", "secret answer"), input_items("q"))
    rotated = _store(tenants, sealer=ResponseSealer(lambda: b"t" * 32))
    caplog.set_level("WARNING")
    with pytest.raises(NotFound) as missing:
        await rotated.history("ten_a", "resp_1")
    assert missing.value.param == "previous_response_id"
    (record,) = [r for r in caplog.records if r.getMessage().startswith("a stored response")]
    assert record.event == "response_unreadable"  # type: ignore[attr-defined]
    assert "secret answer" not in caplog.text
    await rotated.delete("ten_a", "resp_1")
    with pytest.raises(NotFound):
        await _store(tenants).get("ten_a", "resp_1")


async def test_a_sealed_blob_moved_to_another_row_does_not_open(tenants: Database) -> None:
    store = _store(tenants)
    await store.save("ten_a", _answer("resp_1", "one"), input_items("first"))
    await store.save("ten_a", _answer("resp_2", "two"), input_items("second"))
    async with tenants.session() as session:
        first = await session.scalar(
            select(StoredResponse.sealed).where(StoredResponse.id == "resp_1")
        )
        await session.execute(
            update(StoredResponse).where(StoredResponse.id == "resp_2").values(sealed=first)
        )
    with pytest.raises(NotFound):
        await store.get("ten_a", "resp_2")
    assert (await store.get("ten_a", "resp_1")).body["output"][0]["content"][0]["text"] == "one"


async def test_a_row_stored_before_sealing_still_reads(tenants: Database) -> None:
    async with tenants.session() as session:
        session.add(
            StoredResponse(
                id="resp_old",
                tenant_id="ten_a",
                model="demo",
                input_items=input_items("plain prompt"),
                body=_answer("resp_old", "plain answer"),
                created_at=utcnow(),
                expires_at=utcnow() + timedelta(days=1),
            )
        )
    history = await _store(tenants).history("ten_a", "resp_old")
    assert [i["role"] for i in history] == ["user", "assistant"]
    assert history[1]["content"][0]["text"] == "plain answer"
