"""`KubernetesScaler` against a fake Kubernetes API server over real HTTP.

The fake stands for an external API (no cluster in CI): it records each
PATCH and answers like the API server (the Scale object, or a Status error).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from hydrant.platform.dispatch.kubernetes import KubernetesError, KubernetesScaler
from hydrant.platform.dispatch.scaler import PoolSpec

TOKEN = "sa-token-123"


class FakeApi:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.deployments = {"hydrant-worker-demo"}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_PATCH(self) -> None:  # http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.patches.append(
                    {
                        "path": self.path,
                        "content_type": self.headers["content-type"],
                        "auth": self.headers["authorization"],
                        "body": body,
                    }
                )
                name = self.path.split("/deployments/")[1].split("/")[0]
                if self.headers["authorization"] != f"Bearer {TOKEN}":
                    return self._send(401, {"kind": "Status", "message": "Unauthorized"})
                if name not in api.deployments:
                    message = f'deployments.apps "{name}" not found'
                    return self._send(404, {"kind": "Status", "message": message})
                self._send(200, {"kind": "Scale", "spec": body.get("spec", {})})

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


@pytest.fixture()
def fake_api() -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


SPEC = PoolSpec(model="demo", path="/models/demo-v2", quantization="int8")


async def test_scale_patches_the_deployments_scale_subresource(
    fake_api: tuple[FakeApi, str],
) -> None:
    api, url = fake_api
    scaler = KubernetesScaler.from_settings(
        url, TOKEN, "serving", "hydrant-worker-{model}", "worker"
    )
    await scaler.scale(SPEC, 0)
    await scaler.scale(SPEC, 2)
    assert [p["body"] for p in api.patches] == [
        {"spec": {"replicas": 0}},
        {"spec": {"replicas": 2}},
    ]
    first = api.patches[0]
    assert first["path"] == "/apis/apps/v1/namespaces/serving/deployments/hydrant-worker-demo/scale"
    assert first["content_type"] == "application/merge-patch+json"
    assert first["auth"] == f"Bearer {TOKEN}"


async def test_update_sets_the_checkpoint_in_the_pod_template(
    fake_api: tuple[FakeApi, str],
) -> None:
    api, url = fake_api
    scaler = KubernetesScaler.from_settings(
        url, TOKEN, "serving", "hydrant-worker-{model}", "worker"
    )
    assert scaler.rolls_itself
    await scaler.update(SPEC)
    patch = api.patches[0]
    assert patch["path"].endswith("/deployments/hydrant-worker-demo")
    assert patch["content_type"] == "application/strategic-merge-patch+json"
    container = patch["body"]["spec"]["template"]["spec"]["containers"][0]
    assert container["name"] == "worker"
    assert {"name": "HYDRANT_WORKER_PATH", "value": "/models/demo-v2"} in container["env"]
    assert {"name": "HYDRANT_WORKER_QUANTIZATION", "value": "int8"} in container["env"]


async def test_refusals_are_clear_errors(fake_api: tuple[FakeApi, str]) -> None:
    _, url = fake_api
    missing = KubernetesScaler.from_settings(url, TOKEN, "serving", "nope-{model}", "worker")
    with pytest.raises(KubernetesError, match=r"404.*nope-demo"):
        await missing.scale(SPEC, 1)
    wrong = KubernetesScaler.from_settings(
        url, "bad", "serving", "hydrant-worker-{model}", "worker"
    )
    with pytest.raises(KubernetesError, match="401"):
        await wrong.scale(SPEC, 1)
    gone = KubernetesScaler.from_settings("http://127.0.0.1:1", TOKEN, "s", "d", "worker")
    with pytest.raises(KubernetesError, match="unreachable"):
        await gone.scale(SPEC, 1)


def test_in_cluster_settings_come_from_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok\n")
    (tmp_path / "namespace").write_text("prod")
    scaler = KubernetesScaler.from_settings(
        None, None, "default", "hydrant-worker-{model}", "worker", service_account=tmp_path
    )
    assert scaler.token == "tok" and scaler.namespace == "prod"
    assert scaler.api_url == "https://kubernetes.default.svc"
    with pytest.raises(KubernetesError, match="HYDRANT_K8S_TOKEN"):
        KubernetesScaler.from_settings(
            None, None, "default", "x", "worker", service_account=tmp_path / "none"
        )
