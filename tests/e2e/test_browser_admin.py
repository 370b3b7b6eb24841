"""The admin web in a real headless Chromium (Debian's), against a real `hydrant serve`.

Signs in, makes a tenant and a key (shown once), runs real `/v1` traffic, and
checks that the cost report's table and SVG chart move with it and that its
CSV download equals `/admin/reports/costs`. A tenant signed in with its own
key sees its usage and gets 404 for another tenant's page; a form posted
without its CSRF token is refused. Screenshots of the cost report (desktop
and phone width) are saved under `test-artifacts/` at the repository root.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hydrant_server import RunningServer, hydrant_server

pytestmark = [pytest.mark.slow, pytest.mark.integration]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
TIMEOUT_MS = 20_000


def _require_browser() -> Any:
    """Playwright's sync API; skip locally, fail in CI, when it or Chromium is missing."""
    ci = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
    problem = None
    if not CHROMIUM.exists():
        problem = f"Chromium is not installed at {CHROMIUM} (run .ci/browser)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        problem = "the playwright package is not installed (pip install -e '.[dev]')"
    if problem is not None:
        if ci:
            pytest.fail(f"{problem} (CI=true: a missing browser is a failure)")
        pytest.skip(problem)
    return sync_playwright


@pytest.fixture(scope="module")
def server(
    demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    with hydrant_server(tmp_path_factory.mktemp("web"), demo_model_dir) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _require_browser()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=60_000
        )
        try:
            yield chromium
        finally:
            chromium.close()


def _today() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


def _sign_in(page: Any, base_url: str, key: str) -> None:
    page.goto(f"{base_url}/ui/")
    assert "/ui/sign-in" in page.url
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state()


def _chat(server: RunningServer, key: str, count: int) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        for n in range(count):
            response = client.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": f"Say something {n}"}],
                    "max_tokens": 4,
                },
            )
            assert response.status_code == 200, response.text


def _api_costs(server: RunningServer, **params: str) -> httpx.Response:
    with server.admin() as client:
        response = client.get("/admin/reports/costs", params=params)
        assert response.status_code == 200, response.text
        return response


def _wait_for_requests(server: RunningServer, expected: int, **params: str) -> dict[str, Any]:
    """The ledger is written as requests finish: wait (bounded) until the API counts them."""
    deadline = time.monotonic() + 15
    while True:
        body: dict[str, Any] = _api_costs(server, **params).json()
        if body["totals"]["requests"] >= expected or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def _chart_value(page: Any, chart: str, bucket: str, series: str | None = None) -> str:
    selector = f'svg[data-chart="{chart}"]'
    if series is not None:
        selector += f' g[data-series="{series}"]'
    value = page.locator(f'{selector} circle[data-bucket="{bucket}"]').first.get_attribute(
        "data-value"
    )
    assert value is not None
    return str(value)


UNLABELLED_CONTROLS = """() => [...document.querySelectorAll('input, select, textarea')]
    .filter(el => el.type !== 'hidden' && el.labels.length === 0 && !el.getAttribute('aria-label'))
    .map(el => el.outerHTML)"""
WIDER_THAN_SCREEN = """() => [...document.querySelectorAll('body *')]
    .filter(el => el.getBoundingClientRect().right > 391 && !el.closest('.table-scroll'))
    .map(el => el.tagName + '.' + el.className).slice(0, 8)"""
HEADINGS = "() => [...document.querySelectorAll('h1, h2, h3')].map(h => h.tagName)"


def _check_accessible_and_narrow(page: Any, path: str) -> None:
    """Every control labelled, one h1 first, no level skipped, no sideways scroll at 390px."""
    assert page.evaluate("document.documentElement.lang") == "en", path
    assert page.evaluate(UNLABELLED_CONTROLS) == [], path
    levels = [int(tag[1]) for tag in page.evaluate(HEADINGS)]
    assert levels[0] == 1 and levels.count(1) == 1, (path, levels)
    assert all(b - a <= 1 for a, b in itertools.pairwise(levels)), (path, levels)
    wide = page.evaluate(WIDER_THAN_SCREEN)
    assert page.evaluate("document.documentElement.scrollWidth") <= 390, (path, wide)


def test_admin_web_end_to_end(server: RunningServer, browser: Any) -> None:
    today = _today()
    period = {"since": today, "until": today}
    report_url = f"{server.base_url}/ui/reports/costs?since={today}&until={today}"
    context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    try:
        # Sign in with the admin key: the cost report, empty so far.
        _sign_in(page, server.base_url, server.admin_key)
        assert page.url.endswith("/ui/reports/costs")
        page.goto(report_url)
        assert page.locator("#total-requests").get_attribute("data-value") == "0"
        assert _chart_value(page, "requests", today) == "0"

        # A tenant and a key, made on the pages; the secret is shown once.
        page.get_by_role("link", name="Tenants").click()
        page.get_by_label("Name", exact=True).fill("acme-browser")
        page.get_by_role("button", name="Create tenant").click()
        assert page.get_by_role("heading", level=1).inner_text() == "acme-browser"
        tenant_url = page.url.split("?")[0]
        acme_id = tenant_url.rsplit("/", 1)[1]
        page.get_by_label("Name of the new key").fill("browser key")
        page.get_by_role("button", name="Create key").click()
        secret = page.locator("input#secret").input_value()
        assert secret.startswith("hyd_")
        shown_url = page.url
        page.reload()
        assert "already been shown" in page.content()
        assert secret not in page.content()
        page.goto(shown_url)
        assert secret not in page.content()
        page.goto(tenant_url)
        assert "browser key" in page.content() and secret not in page.content()

        # Real traffic on /v1 with that key, and a little from another tenant.
        globex_id, globex_key = server.tenant_key("globex-browser")
        _chat(server, secret, 3)
        _chat(server, globex_key, 1)
        api = _wait_for_requests(server, 4, **period)
        assert api["totals"]["requests"] == 4

        # The report and its chart moved: 4 requests today, in the table and the SVG.
        page.goto(report_url)
        assert page.locator("#total-requests").get_attribute("data-value") == "4"
        assert _chart_value(page, "requests", today) == "4"
        charged_svg = _chart_value(page, "cost", today, "charged")
        assert charged_svg == api["totals"]["charged"]
        table_requests = page.locator('#report-table td[data-col="requests"]').all_inner_texts()
        assert sum(int(t) for t in table_requests) == 4
        table_charged = page.locator('#report-table td[data-col="charged"]').all_inner_texts()
        assert sorted(table_charged) == sorted(r["charged"] for r in api["data"])
        assert page.locator('svg[data-chart="by-model"] g[data-label="demo"]').count() == 1

        # Filtered to the tenant: its 3 requests only.
        page.get_by_label("Tenant", exact=True).select_option(acme_id)
        page.get_by_role("button", name="Show").click()
        page.wait_for_load_state()
        assert page.locator("#total-requests").get_attribute("data-value") == "3"

        # The CSV download equals the API's CSV for the same filters, byte for byte.
        with page.expect_download() as download_info:
            page.locator("#csv-link").click()
        downloaded = Path(download_info.value.path()).read_bytes()
        api_csv = _api_costs(server, **period, tenant_id=acme_id, format="csv").content
        assert downloaded == api_csv
        lines = downloaded.decode().strip().splitlines()
        assert len(lines) == 2  # header + one (day, tenant, model)
        assert lines[1].split(",")[3] == "3"  # the tenant's 3 requests

        # Screenshots of the report: desktop, then phone width.
        ARTIFACTS.mkdir(exist_ok=True)
        page.goto(tenant_url)
        page.screenshot(path=str(ARTIFACTS / "tenant-desktop.png"), full_page=True)
        page.goto(f"{server.base_url}/ui/reports/costs")  # the default: the last 7 days
        assert page.locator("#total-requests").get_attribute("data-value") == "4"
        page.screenshot(path=str(ARTIFACTS / "cost-report-desktop.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.reload()
        page.screenshot(path=str(ARTIFACTS / "cost-report-phone.png"), full_page=True)
        _check_accessible_and_narrow(page, "/ui/reports/costs")
        print(f"screenshots: {ARTIFACTS}/cost-report-desktop.png, cost-report-phone.png")
        for path in ("/ui/tenants", tenant_url.removeprefix(server.base_url), "/ui/models"):
            page.goto(f"{server.base_url}{path}")
            _check_accessible_and_narrow(page, path)

        # A form posted without its CSRF token is refused, and does nothing.
        page.set_viewport_size({"width": 1280, "height": 900})
        page.goto(f"{server.base_url}/ui/tenants")
        page.get_by_label("Name", exact=True).fill("no-token")
        page.locator('form[action="/ui/tenants"] input[name="csrf_token"]').evaluate(
            "input => input.remove()"
        )
        with page.expect_response(lambda r: r.request.method == "POST") as posted:
            page.get_by_role("button", name="Create tenant").click()
        assert posted.value.status == 403
        assert "security token" in page.content()
        with server.admin() as admin:
            names = [t["name"] for t in admin.get("/admin/tenants").json()["data"]]
        assert "no-token" not in names
    finally:
        context.close()

    # A tenant signed in with its own key: its usage only; another tenant's page is 404.
    tenant_context = browser.new_context(viewport={"width": 1280, "height": 900})
    tenant_context.set_default_timeout(TIMEOUT_MS)
    tenant_page = tenant_context.new_page()
    try:
        _sign_in(tenant_page, server.base_url, secret)
        assert tenant_page.url.split("?")[0].endswith(f"/ui/tenants/{acme_id}/usage")
        assert tenant_page.locator("#total-requests").get_attribute("data-value") == "3"
        assert "globex-browser" not in tenant_page.content()
        other = tenant_page.goto(f"{server.base_url}/ui/tenants/{globex_id}/usage")
        assert other is not None and other.status == 404
        admin_only = tenant_page.goto(f"{server.base_url}/ui/reports/costs")
        assert admin_only is not None and admin_only.status == 403
    finally:
        tenant_context.close()
