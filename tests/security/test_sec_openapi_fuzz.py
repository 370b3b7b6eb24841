"""schemathesis against the gateway's own OpenAPI schema, on a real `hydrant serve` process.

Every operation, with no key, an admin key and a tenant's inference key: no
answer may be a 5xx, and every answer must match the schema (status code
declared, content type declared, body valid against the declared schema,
errors included: they are OpenAI error objects, see `hydrant.platform.http.openapi`).
Examples per operation are bounded so the run takes a minute or two.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hydrant_server import RunningServer, hydrant_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.slow

EXAMPLES = 16
EXAMPLES_V1 = 40
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    env = {"HYDRANT_AUTH_MAX_FAILURES": "100000", "HYDRANT_DEFAULT_MAX_TOKENS": "4"}
    with hydrant_server(tmp_path_factory.mktemp("fuzz"), demo_model_dir, env=env) as running:
        yield running


@pytest.fixture(scope="module")
def auth_variants(server: RunningServer) -> dict[str, dict[str, str]]:
    _, tenant_secret = server.tenant_key("fuzz-tenant")
    return {
        "anonymous": {},
        "admin": {"Authorization": f"Bearer {server.admin_key}"},
        "tenant": {"Authorization": f"Bearer {tenant_secret}"},
    }


def test_no_operation_answers_5xx_or_breaks_its_schema(
    server: RunningServer, auth_variants: dict[str, dict[str, str]]
) -> None:
    schema = schemathesis.openapi.from_url(f"{server.base_url}/schema/openapi.json")
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        failure = _fuzz(operation, auth_variants)
        if failure is not None:
            failures.append(f"{operation.label}: {failure}")
    assert operations >= 30, operations  # the schema lists the API, not a stub
    assert not failures, "\n\n".join(failures)


def _fuzz(operation: Any, auth_variants: dict[str, dict[str, str]]) -> str | None:
    """Run bounded examples of one operation; the first failure, shrunk, as text."""

    @settings(
        max_examples=EXAMPLES_V1 if operation.path.startswith("/v1/") else EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    @given(case=_cases(operation))
    def run(case: Any) -> None:
        body = case.body if isinstance(case.body, dict) else None
        for field in ("max_tokens", "max_completion_tokens"):
            if body is not None and isinstance(body.get(field), int):
                # The demo model is noise; long generations only cost CPU time.
                body[field] = min(body[field], 8)
        for name, headers in auth_variants.items():
            _call(case, name, headers)
        if body is not None and "model" in body and body["model"] != "demo":
            # A random model name is a 404 before any real work; the served one reaches
            # the tokenizer, the quota gate, the engine and the ledger.
            body["model"] = "demo"
            _call(case, "tenant, model=demo", auth_variants["tenant"])

    try:
        run()
    except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup
        return f"{type(exc).__name__}: {_describe(exc)}"[:4000]
    return None


def _cases(operation: Any) -> st.SearchStrategy[Any]:
    """Valid requests and, where the schema allows any, requests that break it (those must be
    refused with a declared 4xx, never a 5xx)."""
    return st.one_of(
        operation.as_strategy(GenerationMode.POSITIVE),
        operation.as_strategy(GenerationMode.NEGATIVE),
    )


def _call(case: Any, name: str, headers: dict[str, str]) -> None:
    try:
        case.call_and_validate(headers=headers, checks=CHECKS, timeout=60)
    except BaseExceptionGroup as group:
        raise AssertionError(f"[{name}] {_describe(group)}") from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return f"{exc}: " + "; ".join(_describe(e) for e in exc.exceptions)
    return str(exc)
