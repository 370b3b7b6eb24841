"""Start a real `hydrant serve` process for end-to-end tests, and stop it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from hydrant.platform.keys import generate_key


def with_chat_template(model_dir: Path, target: Path, template: str) -> Path:
    """A copy of a checkpoint whose tokenizer carries another chat template: the same
    weights made to look like another model family (Hermes tools, Qwen 3 thinking)."""
    shutil.copytree(model_dir, target)
    config_file = target / "tokenizer_config.json"
    config = json.loads(config_file.read_text("utf-8"))
    config["chat_template"] = template
    config_file.write_text(json.dumps(config), "utf-8")
    return target


@contextmanager
def tenant_client(data_dir: Path, model_dir: Path, tenant: str) -> Iterator[Any]:
    """A server for `model_dir` (as `demo`) and an `openai` client with a tenant's key."""
    import openai

    with hydrant_server(data_dir, model_dir) as running:
        _, secret = running.tenant_key(tenant)
        client = openai.OpenAI(base_url=f"{running.base_url}/v1", api_key=secret, max_retries=0)
        with client:  # its pooled connections closed here, not by the garbage collector
            yield client


def wait_for(predicate: Any, timeout_s: float = 15.0, every_s: float = 0.1) -> bool:
    """Whether `predicate()` came true within `timeout_s` (asked every `every_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningServer:
    base_url: str
    admin_key: str
    data_dir: Path
    log_file: Path
    process: subprocess.Popen[bytes]

    def admin(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )

    def ledger_entry(self, request_id: str) -> tuple[object, ...] | None:
        """(status, input, cached and output tokens, charged) of a request's ledger entry in
        the embedded SQLite database, waiting up to 5 s for it to be written; None if none."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with sqlite3.connect(self.data_dir / "hydrant.db") as db:
                row = db.execute(
                    "SELECT status, input_tokens, cached_tokens, output_tokens, charged "
                    "FROM ledger_entries WHERE request_id = ?",
                    (request_id,),
                ).fetchone()
            if row is not None:
                return tuple(row)
            time.sleep(0.1)
        return None

    def ledger_rows(self, tenant_id: str) -> list[tuple[Any, ...]]:
        """(request id, status, input and output tokens, device seconds) of a tenant's
        ledger entries in the embedded SQLite database, oldest first."""
        with sqlite3.connect(self.data_dir / "hydrant.db") as db:
            return db.execute(
                "SELECT request_id, status, input_tokens, output_tokens, device_seconds"
                " FROM ledger_entries WHERE tenant_id = ? ORDER BY started_at",
                (tenant_id,),
            ).fetchall()

    def tenant_key(self, name: str, plan: str | None = None) -> tuple[str, str]:
        """Create a tenant and an inference key through the admin API: (tenant id, secret)."""
        with self.admin() as client:
            body: dict[str, object] = {"name": name}
            if plan is not None:
                body["plan"] = plan
            tenant = client.post("/admin/tenants", json=body)
            tenant.raise_for_status()
            tenant_id = tenant.json()["id"]
            key = client.post("/admin/keys", json={"tenant_id": tenant_id})
            key.raise_for_status()
            return tenant_id, key.json()["secret"]

    def new_key(self, tenant_id: str) -> str:
        """Another inference key of an existing tenant (its secret)."""
        with self.admin() as client:
            key = client.post("/admin/keys", json={"tenant_id": tenant_id})
            key.raise_for_status()
            return str(key.json()["secret"])

    def create_plan(self, name: str, **limits: object) -> str:
        """A plan through `POST /admin/plans` (fields: `PlanCreate`); its id."""
        with self.admin() as client:
            plan = client.post("/admin/plans", json={"name": name, **limits})
            plan.raise_for_status()
            return str(plan.json()["id"])

    def stop(self, timeout_s: float = 20) -> int:
        """Stop the server gracefully (SIGTERM: the lifespan's shutdown runs); its exit code."""
        return _stop(self.process, timeout_s)


def _stop(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


@contextmanager
def hydrant_server(
    data_dir: Path,
    model_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
    admin_key: str | None = None,
) -> Iterator[RunningServer]:
    """A ready server; pass `admin_key` to share one bootstrap key between several gateways."""
    port = free_port()
    admin_key = admin_key or generate_key("test").secret
    log_file = data_dir / "server.log"
    environ = {
        **os.environ,
        "HYDRANT_DATA_DIR": str(data_dir),
        "HYDRANT_PORT": str(port),
        "HYDRANT_MODELS": f"demo={model_dir}",
        "HYDRANT_ADMIN_BOOTSTRAP_KEY": admin_key,
        "HYDRANT_LOG_FILE": str(log_file),
        "HYDRANT_KV_CACHE_BYTES": str(32 * 1024 * 1024),
        **(env or {}),
    }
    with open(data_dir / "server.stderr", "wb") as stderr_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "hydrant.cli", "serve"],
            env=environ,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
        )
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            if process.poll() is not None:
                stderr = (data_dir / "server.stderr").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"hydrant serve exited with {process.returncode}:\n{stderr}")
            try:
                if httpx.get(f"{base_url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("hydrant serve did not become ready")
            time.sleep(0.3)
        yield RunningServer(base_url, admin_key, data_dir, log_file, process)
    finally:
        _stop(process, 20)
