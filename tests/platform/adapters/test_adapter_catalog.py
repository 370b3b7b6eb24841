"""Which adapter a request's `model` names, for whom: the gateway's resolution rules."""

from __future__ import annotations

from decimal import Decimal

import pytest

from hydrant.engine.protocol import AdapterRef
from hydrant.platform.adapters.catalog import AdapterCatalog, AdapterEntry
from hydrant.platform.billing.pricing import Price, adapter_model_name, price_of
from hydrant.platform.errors import InvalidRequest

SERVED = ("llama", "qwen:0.5b")


def _catalog(*entries: AdapterEntry) -> AdapterCatalog:
    catalog = AdapterCatalog(None)
    for entry in entries:
        catalog.put(entry)
    return catalog


def _entry(base: str, name: str, tenant: str | None) -> AdapterEntry:
    return AdapterEntry(base, name, f"/adapters/{name}", tenant, 0)


def test_a_private_adapter_resolves_for_its_tenant_only() -> None:
    catalog = _catalog(_entry("llama", "sql", "ten_a"))
    entry = catalog.resolve("llama:sql", "ten_a", SERVED)
    assert entry is not None and entry.ref == AdapterRef(name="llama:sql", path="/adapters/sql")
    assert catalog.resolve("sql", "ten_a", SERVED) == entry  # its name alone
    assert catalog.resolve("llama:sql", "ten_b", SERVED) is None  # as unknown: 404
    assert catalog.resolve("sql", "ten_b", SERVED) is None
    assert catalog.resolve("llama:sql", None, SERVED) == entry  # an admin key sees all
    assert [e.model_name for e in catalog.visible("ten_b")] == []


def test_public_adapters_and_unserved_bases() -> None:
    catalog = _catalog(_entry("llama", "chat", None), _entry("mistral", "chat2", None))
    assert catalog.resolve("llama:chat", "ten_b", SERVED) is not None
    assert catalog.resolve("mistral:chat2", "ten_b", SERVED) is None  # base not served here
    assert catalog.resolve("chat2", "ten_b", SERVED) is None
    assert catalog.resolve("llama:nope", "ten_b", SERVED) is None
    # A base model whose own name holds a colon: the adapter is after the last one.
    catalog.put(_entry("qwen:0.5b", "ft", None))
    assert catalog.resolve("qwen:0.5b:ft", "ten_b", SERVED) is not None


def test_a_name_on_two_base_models_must_be_qualified() -> None:
    catalog = _catalog(_entry("llama", "ft", None), _entry("qwen:0.5b", "ft", "ten_a"))
    assert catalog.resolve("ft", "ten_b", SERVED) is not None  # sees only the public one
    with pytest.raises(InvalidRequest) as refused:
        catalog.resolve("ft", "ten_a", SERVED)
    assert "use one of: llama:ft, qwen:0.5b:ft" in refused.value.message


def test_local_changes_hold_and_removal_is_immediate() -> None:
    catalog = _catalog(_entry("llama", "sql", "ten_a"))
    catalog.discard("llama", "sql")
    assert catalog.resolve("llama:sql", "ten_a", SERVED) is None


def test_an_adapter_is_priced_at_its_own_version_else_its_base_models() -> None:
    base = Price(input_per_million=Decimal(1), output_per_million=Decimal(2))
    own = Price(input_per_million=Decimal(3), output_per_million=Decimal(4))
    book = {"llama": base, "llama:sql": own}
    assert price_of(book.get, "llama", "sql") is own
    assert price_of(book.get, "llama", "chat") is base
    assert price_of(book.get, "llama", None) is base
    assert adapter_model_name("llama", "sql") == "llama:sql"
    assert adapter_model_name("llama", None) == "llama"
