"""A fake Kubernetes API server over real HTTP: the scale and patch calls the scalers make.

It stands for an external API (no cluster in CI): it records each PATCH and
answers like the API server (the Scale object, or a Status error), for the
workload resources Hydrant scales (Deployments, LeaderWorkerSets).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

TOKEN = "sa-token-123"
# the API path of each workload resource, as the API server serves them
RESOURCES = {
    "deployments": "/apis/apps/v1",
    "leaderworkersets": "/apis/leaderworkerset.x-k8s.io/v1",
}
PATH = re.compile(r"^(?P<api>/apis/.+)/namespaces/[^/]+/(?P<resource>[a-z]+)/(?P<name>[^/]+)")


class FakeApi:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.workloads = {
            "deployments": {"hydrant-worker-demo", "vllm-demo"},
            "leaderworkersets": {"vllm-demo"},
        }
        #: called (from the server's thread) with (resource, replicas) after each scale
        self.on_scale: Callable[[str, int], None] | None = None

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
                match = PATH.match(self.path)
                if self.headers["authorization"] != f"Bearer {TOKEN}":
                    return self._send(401, {"kind": "Status", "message": "Unauthorized"})
                resource, name = (match["resource"], match["name"]) if match else ("", "")
                if not match or RESOURCES.get(resource) != match["api"]:
                    return self._send(404, {"kind": "Status", "message": "the server could not"})
                if name not in api.workloads[resource]:
                    message = f'{resource} "{name}" not found'
                    return self._send(404, {"kind": "Status", "message": message})
                self._send(200, {"kind": "Scale", "spec": body.get("spec", {})})
                if self.path.endswith("/scale") and api.on_scale is not None:
                    api.on_scale(resource, body["spec"]["replicas"])

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
