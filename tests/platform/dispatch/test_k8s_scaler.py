"""`KubernetesScaler` against a fake Kubernetes API server over real HTTP.

The fake stands for an external API (no cluster in CI): it records each
PATCH and answers like the API server (the Scale object, or a Status error).
Upstream pools (vLLM's Deployment or LeaderWorkerSet) scaled from zero by the
gateway through it: test_upstream_scaling.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from k8s_fake_api import TOKEN, FakeApi, fake_api

from hydrant.errors import ConfigurationError
from hydrant.platform.dispatch.kubernetes import KubernetesError, KubernetesScaler
from hydrant.platform.dispatch.scaler import PoolSpec

__all__ = ["fake_api"]  # the fixture, used by name

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


async def test_an_upstream_workload_is_scaled_through_its_own_resource(
    fake_api: tuple[FakeApi, str],
) -> None:
    api, url = fake_api
    base = KubernetesScaler.from_settings(url, TOKEN, "serving", "hydrant-worker-{model}", "w")
    group = base.for_upstream("leaderworkerset/vllm-{model}")
    await group.scale(SPEC, 1)
    deployment = base.for_upstream("deployment/vllm-{model}")
    await deployment.scale(SPEC, 0)
    await base.scale(SPEC, 3)  # the worker pools' scaler is unchanged
    assert [(p["path"], p["body"]) for p in api.patches] == [
        (
            "/apis/leaderworkerset.x-k8s.io/v1/namespaces/serving/leaderworkersets/vllm-demo/scale",
            {"spec": {"replicas": 1}},
        ),
        ("/apis/apps/v1/namespaces/serving/deployments/vllm-demo/scale", {"spec": {"replicas": 0}}),
        (
            "/apis/apps/v1/namespaces/serving/deployments/hydrant-worker-demo/scale",
            {"spec": {"replicas": 3}},
        ),
    ]
    assert {p["content_type"] for p in api.patches} == {"application/merge-patch+json"}
    missing = base.for_upstream("leaderworkerset/other-{model}")
    with pytest.raises(KubernetesError, match=r'404.*leaderworkersets "other-demo"'):
        await missing.scale(SPEC, 1)


@pytest.mark.parametrize(
    "workload", ["statefulset/vllm-{model}", "deployment/vllm", "vllm-{model}", ""]
)
def test_an_upstream_workload_setting_is_checked(workload: str) -> None:
    base = KubernetesScaler.from_settings("http://k", TOKEN, "s", "hydrant-worker-{model}", "w")
    with pytest.raises(ConfigurationError, match="HYDRANT_K8S_UPSTREAM_WORKLOAD"):
        base.for_upstream(workload)
