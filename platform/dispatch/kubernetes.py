"""`KubernetesScaler`: a pool is a Deployment; scaling patches its replicas through the API.

For clusters without KEDA (with KEDA, the ScaledObject in infra/ scales on
the gateway's metrics and this scaler is not needed). Talks to the API
server with plain HTTPS: in a pod, the service account's token and CA from
the standard mount; elsewhere a URL and a bearer token from the settings.
A swap patches the worker container's `HYDRANT_WORKER_PATH` (and
quantization) in the pod template: Kubernetes then rolls the pods, new ones
first (readiness on `/healthz`), old ones drained by SIGTERM.

An upstream pool (vLLM) is scaled the same way through `for_upstream`: its
workload is a Deployment or a LeaderWorkerSet (one replica = one multi-node
group), both patched through their scale subresource.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from hydrant.errors import ConfigurationError
from hydrant.platform.dispatch.scaler import PoolSpec
from hydrant.settings import ENV_PREFIX

log = logging.getLogger(__name__)

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_URL = "https://kubernetes.default.svc"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# The workloads an upstream pool may be (HYDRANT_K8S_UPSTREAM_WORKLOAD): their API path and
# resource, each with a scale subresource.
WORKLOADS = {
    "deployment": ("apis/apps/v1", "deployments"),
    "leaderworkerset": ("apis/leaderworkerset.x-k8s.io/v1", "leaderworkersets"),
}


class KubernetesError(Exception):
    """The API server refused a change (or could not be reached); the message says which."""


@dataclass
class KubernetesScaler:
    api_url: str
    token: str
    namespace: str = "default"
    deployment: str = "hydrant-worker-{model}"
    container: str = "worker"
    verify: str | bool = True
    api_path: str = "apis/apps/v1"
    resource: str = "deployments"
    rolls_itself = True

    @classmethod
    def from_settings(
        cls,
        api_url: str | None,
        token: str | None,
        namespace: str,
        deployment: str,
        container: str,
        service_account: Path = SERVICE_ACCOUNT,
    ) -> KubernetesScaler:
        """Explicit URL and token, else the in-cluster service account."""
        verify: str | bool = True
        if token is None:
            token_file = service_account / "token"
            if not token_file.is_file():
                raise KubernetesError(
                    "no Kubernetes token: set HYDRANT_K8S_TOKEN (and HYDRANT_K8S_API_URL)"
                    " or run in a pod with a service account"
                )
            token = token_file.read_text().strip()
            ca = service_account / "ca.crt"
            verify = str(ca) if ca.is_file() else True
            ns_file = service_account / "namespace"
            if namespace == "default" and ns_file.is_file():
                namespace = ns_file.read_text().strip()
        return cls(
            api_url=(api_url or IN_CLUSTER_URL).rstrip("/"),
            token=token,
            namespace=namespace,
            deployment=deployment,
            container=container,
            verify=verify,
        )

    def for_upstream(self, workload: str) -> KubernetesScaler:
        """The same API access, scaling an upstream pool's workload: `KIND/NAME-TEMPLATE`."""
        kind, _, name = workload.partition("/")
        if kind not in WORKLOADS or "{model}" not in name:
            raise ConfigurationError(
                f"upstream workload {workload!r} must look like KIND/NAME with KIND one of"
                f" {', '.join(WORKLOADS)} and {{model}} in NAME"
                f" ({ENV_PREFIX}K8S_UPSTREAM_WORKLOAD)"
            )
        api_path, resource = WORKLOADS[kind]
        return replace(self, deployment=name, api_path=api_path, resource=resource)

    def deployment_name(self, model: str) -> str:
        return self.deployment.format(model=model)

    def _url(self, model: str, scale: bool = False) -> str:
        name = self.deployment_name(model)
        base = f"{self.api_url}/{self.api_path}/namespaces/{self.namespace}/{self.resource}/{name}"
        return base + "/scale" if scale else base

    async def _patch(self, url: str, body: object, content_type: str) -> dict[str, object]:
        headers = {"authorization": f"Bearer {self.token}", "content-type": content_type}
        try:
            async with httpx.AsyncClient(verify=self.verify, timeout=15.0) as client:
                response = await client.patch(url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise KubernetesError(f"Kubernetes API unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 400:
            try:
                reason = response.json().get("message", response.text)
            except ValueError:
                reason = response.text
            raise KubernetesError(f"Kubernetes API answered {response.status_code}: {reason}")
        result: dict[str, object] = response.json()
        return result

    async def scale(self, spec: PoolSpec, replicas: int) -> None:
        await self._patch(
            self._url(spec.model, scale=True), {"spec": {"replicas": replicas}}, MERGE_PATCH
        )
        log.info(
            "workload scaled",
            extra={"model": spec.model, "resource": self.resource, "replicas": replicas},
        )

    async def update(self, spec: PoolSpec) -> None:
        env = [
            {"name": "HYDRANT_WORKER_PATH", "value": spec.path},
            {"name": "HYDRANT_WORKER_QUANTIZATION", "value": spec.quantization or ""},
        ]
        body = {
            "spec": {"template": {"spec": {"containers": [{"name": self.container, "env": env}]}}}
        }
        await self._patch(self._url(spec.model), body, STRATEGIC_PATCH)
        log.info("deployment updated", extra={"model": spec.model})

    async def retire(self, keep: PoolSpec) -> None:
        return None  # the Deployment's rollout replaces old pods itself

    async def close(self) -> None:
        return None
