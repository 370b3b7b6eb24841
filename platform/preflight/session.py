"""The HTTP side of a preflight run: its throwaway tenant and key, requests, scrapes.

Preflight talks to the deployment only through its public HTTP API (the admin
API, `/v1`, `/metrics`), exactly as a client and an operator would, so what it
measures is what users get. The tenant it creates is suspended at the end so a
leaked preflight key serves nothing afterwards.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from hydrant.platform.preflight.metrics_text import Scrape

WORD = " lorem"  # calibrated below: how many tokens this is in the model's tokenizer


class PreflightError(RuntimeError):
    """The deployment could not be used at all (unreachable, admin key refused)."""


@dataclass
class Reply:
    status: int
    body: dict[str, Any]
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def text(self) -> str:
        choices = self.body.get("choices") or [{}]
        choice = choices[0]
        if "text" in choice:
            return str(choice["text"])
        return str((choice.get("message") or {}).get("content") or "")

    @property
    def prompt_tokens(self) -> int:
        return int((self.body.get("usage") or {}).get("prompt_tokens", 0))


@dataclass
class PreflightSession:
    url: str
    admin_key: str
    timeout_s: float = 120.0
    metrics_token: str | None = None  # the deployment's HYDRANT_METRICS_TOKEN, when it has one
    model: str = ""
    tenant_id: str = ""
    key: str = ""
    tokens_per_word: float = 1.0
    http: httpx.AsyncClient = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.AsyncClient(
            base_url=self.url.rstrip("/"),
            timeout=self.timeout_s,
            # Idle connections are dropped well before a server closes them (uvicorn: 5 s):
            # a request sent on a connection the server is closing fails with a read error.
            limits=httpx.Limits(
                max_connections=256, max_keepalive_connections=256, keepalive_expiry=1.0
            ),
        )

    # --- admin --------------------------------------------------------------------------

    async def admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = await self.http.request(
            method, path, json=body, headers={"Authorization": f"Bearer {self.admin_key}"}
        )
        if response.status_code in (401, 403):
            raise PreflightError(f"the admin key was refused ({response.status_code}) on {path}")
        response.raise_for_status()
        return response.json()

    async def admin_status(self, path: str) -> tuple[int, Any]:
        """GET an admin route that may not exist on this deployment: (status, body or None)."""
        response = await self.http.get(path, headers={"Authorization": f"Bearer {self.admin_key}"})
        try:
            body = response.json()
        except ValueError:
            body = None
        return response.status_code, body

    async def open(self, model: str | None) -> None:
        """Check the deployment answers, create the throwaway tenant and key, pick the model.

        No inference request yet: the runner looks at the pools first (cold start).
        """
        try:
            ready = await self.http.get("/readyz")
        except httpx.HTTPError as exc:
            raise PreflightError(f"{self.url} is unreachable: {type(exc).__name__}") from exc
        if ready.status_code != 200:
            raise PreflightError(f"{self.url}/readyz answered {ready.status_code}: not ready")
        name = f"preflight-{secrets.token_hex(4)}"
        tenant = await self.admin("POST", "/admin/tenants", {"name": name})
        self.tenant_id = str(tenant["id"])
        key = await self.admin("POST", "/admin/keys", {"tenant_id": self.tenant_id})
        self.key = str(key["secret"])
        listed = await self.http.get("/v1/models", headers=self.auth())
        listed.raise_for_status()
        names = [str(m["id"]) for m in listed.json().get("data", [])]
        if not names:
            raise PreflightError("the deployment serves no model")
        if model is not None and model not in names:
            raise PreflightError(f"model {model!r} is not served (served: {', '.join(names)})")
        self.model = model or names[0]

    async def close(self) -> None:
        try:
            if self.tenant_id:
                await self.admin("POST", f"/admin/tenants/{self.tenant_id}/suspend")
        finally:
            await self.http.aclose()

    # --- inference ----------------------------------------------------------------------

    def auth(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.key}"}

    async def complete(
        self,
        prompt: str,
        max_tokens: int = 8,
        *,
        seed: int | None = None,
        temperature: float = 0.0,
        echo: bool = False,
        key: str | None = None,
    ) -> Reply:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "echo": echo,
        }
        if seed is not None:
            body["seed"] = seed
        return await self._post("/v1/completions", body, key)

    async def chat(self, content: str, max_tokens: int = 8, key: str | None = None) -> Reply:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        return await self._post("/v1/chat/completions", body, key)

    async def _post(self, path: str, body: dict[str, Any], key: str | None) -> Reply:
        started = time.perf_counter()
        try:
            response = await self.http.post(path, json=body, headers=self.auth(key))
        except httpx.HTTPError as exc:
            return Reply(0, {"error": {"message": type(exc).__name__}}, 0.0)
        seconds = time.perf_counter() - started
        try:
            parsed = response.json()
        except ValueError:
            parsed = {}
        return Reply(response.status_code, parsed if isinstance(parsed, dict) else {}, seconds)

    async def abandon_stream(self, prompt: str, max_tokens: int = 64) -> None:
        """A streamed request the client drops after its first chunk (an abort to clean up)."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        try:
            async with self.http.stream(
                "POST", "/v1/completions", json=body, headers=self.auth()
            ) as response:
                async for _ in response.aiter_bytes():
                    break
        except httpx.HTTPError:
            pass

    # --- prompts of a given size --------------------------------------------------------

    async def calibrate(self) -> float:
        """How many tokens `WORD` is, so prompts of N tokens can be written for any tokenizer.

        This is preflight's first request: its time is the cold start when the
        model's pool was at zero. Returns that time.
        """
        started = time.perf_counter()
        probe = await self.complete(WORD * 64, max_tokens=1)
        seconds = time.perf_counter() - started
        if not probe.ok or probe.prompt_tokens <= 0:
            raise PreflightError(
                f"a probe completion failed ({probe.status}): {probe.body.get('error')}"
            )
        self.tokens_per_word = probe.prompt_tokens / 64
        return seconds

    def prompt_of(self, tokens: int, tag: str = "") -> str:
        """A prompt of about `tokens` tokens (a tag in front keeps prompts apart in the cache)."""
        words = max(int(tokens / self.tokens_per_word), 1)
        return (tag + WORD * words).strip()

    # --- observation --------------------------------------------------------------------

    async def scrape(self) -> Scrape:
        headers = {}
        if self.metrics_token:
            headers["Authorization"] = f"Bearer {self.metrics_token}"
        response = await self.http.get("/metrics", headers=headers)
        if response.status_code == 401:
            raise PreflightError(
                "/metrics refused the scrape (401): the deployment sets HYDRANT_METRICS_TOKEN;"
                " pass the same token with --metrics-token or HYDRANT_PREFLIGHT_METRICS_TOKEN"
            )
        response.raise_for_status()
        return Scrape.parse(response.text)

    async def engine(self) -> dict[str, Any] | None:
        """This model's entry of `GET /admin/engines`, or None where the route does not exist."""
        status, body = await self.admin_status("/admin/engines")
        if status != 200 or not isinstance(body, dict):
            return None
        for entry in body.get("data", []):
            if entry.get("model") == self.model:
                return dict(entry)
        return None

    async def wait_idle(self, timeout_s: float = 60.0) -> dict[str, Any] | None:
        """The engine's state once nothing runs or waits (None: it never got there, or no route)."""
        deadline = time.monotonic() + timeout_s
        while True:
            entry = await self.engine()
            if entry is None:
                return None
            if entry.get("num_running") == 0 and entry.get("num_waiting") == 0:
                return entry
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.2)
