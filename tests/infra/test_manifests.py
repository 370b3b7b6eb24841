"""infra/k8s rendered offline (base and every overlay) and checked object by object:
core kinds against the Kubernetes JSON schemas (kubernetes-validate, strict), CRDs
against schemas vendored from their CRDs, and the references between objects.
What the vLLM overlays hold in particular: test_upstream_overlays.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from infra_cli import parse_cli
from infra_render import (
    KustomizeError,
    Obj,
    by_kind,
    find,
    key,
    merge,
    pod_spec,
    pod_templates,
    render,
)

from hydrant.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"
SCHEMAS = Path(__file__).parent / "schemas"
K8S_VERSION = "1.33.0"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.json",
}
TREES = {
    "base": K8S / "base",
    "example": K8S / "overlays" / "example",
    "vllm-tp8": K8S / "overlays" / "vllm-tp8",
    "vllm-multinode": K8S / "overlays" / "vllm-multinode",
}
NAMESPACES = {"example": "hydrant-prod"}  # the others: "hydrant"
# what KEDA's scaleTargetRef may name: kinds with a scale subresource (their apiVersion)
SCALABLE = {"Deployment": "apps/v1", "LeaderWorkerSet": "leaderworkerset.x-k8s.io/v1"}


@pytest.fixture(scope="module", params=sorted(TREES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, render(TREES[request.param])


def _validate_crd(obj: Obj) -> None:
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[(obj["apiVersion"], obj["kind"])]).read_text())
    jsonschema.validate(obj, schema)
    if obj["kind"] == "LeaderWorkerSet":  # its pod templates are core PodTemplateSpecs
        for template in pod_templates(obj):
            kubernetes_validate.validate(
                {
                    "apiVersion": "v1",
                    "kind": "PodTemplate",
                    "metadata": {"name": "t"},
                    "template": template,
                },
                K8S_VERSION,
                strict=True,
            )


def _hydrant_containers(objects: list[Obj]) -> list[Obj]:
    """Containers that run the `hydrant` CLI (not vLLM's), from every pod template."""
    return [
        c
        for workload in objects
        for template in pod_templates(workload)
        for c in template["spec"]["containers"]
        if c["command"][0] == "hydrant"
    ]


def test_every_object_validates(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    assert len(objects) >= 15
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CRD_SCHEMAS:
            _validate_crd(obj)
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_validation_really_rejects_mistakes(rendered: tuple[str, list[Obj]]) -> None:
    """The validators are not vacuous: a typo'd field and a numeric KEDA threshold fail."""
    _, objects = rendered
    deployment = by_kind(objects, "Deployment")[0]
    typo = merge(deployment, {"spec": {"replica": 3}})
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    scaled = by_kind(objects, "ScaledObject")[0]
    bad = merge(scaled, {})
    bad["spec"]["triggers"][0]["metadata"]["threshold"] = 16
    with pytest.raises(jsonschema.ValidationError):
        _validate_crd(bad)
    rule = merge(by_kind(objects, "PrometheusRule")[0], {})
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        _validate_crd(rule)
    for group in by_kind(objects, "LeaderWorkerSet"):
        typo = merge(group, {"spec": {"leaderWorkerTemplate": {"groupSize": 2}}})
        with pytest.raises(jsonschema.ValidationError):
            _validate_crd(typo)
        policy = merge(group, {"spec": {"leaderWorkerTemplate": {"restartPolicy": "Always"}}})
        with pytest.raises(jsonschema.ValidationError):
            _validate_crd(policy)
        in_pod = merge(group, {})  # a typo inside a pod template: the core schema catches it
        in_pod["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["container"] = []
        with pytest.raises(kubernetes_validate.ValidationError):
            _validate_crd(in_pod)


def test_references_between_objects_resolve(rendered: tuple[str, list[Obj]]) -> None:
    name, objects = rendered
    namespace = NAMESPACES.get(name, "hydrant")
    assert by_kind(objects, "Namespace")[0]["metadata"]["name"] == namespace
    for obj in objects:
        if obj["kind"] not in ("Namespace",):
            assert obj["metadata"]["namespace"] == namespace, key(obj)
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    secret = find(objects, "Secret", "hydrant-secrets")
    for deployment in by_kind(objects, "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for container in _hydrant_containers(objects):
        parse_cli(container["command"])  # a command line the real CLI accepts
    templates = [t for o in objects for t in pod_templates(o)]
    for template in templates:
        spec = template["spec"]
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert ("ConfigMap", source["configMapRef"]["name"]) in names
                if "secretRef" in source:
                    assert ("Secret", source["secretRef"]["name"]) in names
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "hydrant-secrets"
                    assert ref["key"] in secret["stringData"]
        for volume in spec.get("volumes", []):
            claim = volume.get("persistentVolumeClaim")
            if claim:
                assert ("PersistentVolumeClaim", claim["claimName"]) in names
    for scaled in by_kind(objects, "ScaledObject") + by_kind(objects, "HorizontalPodAutoscaler"):
        target = scaled["spec"]["scaleTargetRef"]
        kind = target.get("kind", "Deployment")
        assert target.get("apiVersion", "apps/v1") == SCALABLE[kind]
        assert (kind, target["name"]) in names
    for service in by_kind(objects, "Service"):
        selector = service["spec"]["selector"]
        served = [t for t in templates if selector.items() <= t["metadata"]["labels"].items()]
        assert served, service["metadata"]["name"]


def _workers(objects: list[Obj]) -> list[Obj]:
    return [
        d
        for d in by_kind(objects, "Deployment")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "worker"
    ]


def test_worker_pools_request_gpus_probe_healthz_and_pin_device_classes(
    rendered: tuple[str, list[Obj]],
) -> None:
    name, objects = rendered
    workers = _workers(objects)
    assert len(workers) == (2 if name == "example" else 1)
    classes = {}
    for worker in workers:
        model = worker["metadata"]["labels"]["hydrant.dev/model"]
        assert worker["metadata"]["name"] == f"hydrant-worker-{model}"  # the k8s scaler's name
        spec = pod_spec(worker)
        assert spec is not None
        container = spec["containers"][0]
        command = container["command"]
        assert command[:2] == ["hydrant", "worker"]
        assert command[command.index("--model") + 1] == model
        assert command[command.index("--device") + 1].startswith("cuda")
        port = int(command[command.index("--port") + 1])
        resources = container["resources"]
        assert resources["limits"]["nvidia.com/gpu"] == 1
        for probe in ("startupProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz"
            assert container[probe]["httpGet"]["port"] in ("worker", port)
        assert container["ports"][0]["containerPort"] == port
        classes[model] = spec["nodeSelector"]["hydrant.dev/device-class"]
        scaled = find(objects, "ScaledObject", worker["metadata"]["name"])
        assert scaled["spec"]["minReplicaCount"] == 0  # scales to zero
        queries = {t["name"]: t for t in scaled["spec"]["triggers"]}
        assert f'model="{model}"' in queries["queue"]["metadata"]["query"]
        assert "hydrant_pool_waiting_requests" in queries["queue"]["metadata"]["query"]
        kv = queries["kv-cache"]
        assert "hydrant_kv_cache_usage_perc" in kv["metadata"]["query"]
        assert float(kv["metadata"]["threshold"]) == 0.92
        assert kv["metricType"] == "Value"
    if name == "example":
        # a small model on small GPUs; the large one alone on its own, tainted nodes
        assert classes == {"llama-3-8b": "nvidia-l4", "llama-3-70b": "nvidia-h100"}
        large = pod_spec(find(objects, "Deployment", "hydrant-worker-llama-3-70b"))
        assert large is not None
        assert large["nodeSelector"]["hydrant.dev/dedicated"] == "llama-3-70b"
        assert any(t["key"] == "hydrant.dev/dedicated" for t in large["tolerations"])


def test_only_the_gateway_reaches_workers(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    policy = find(objects, "NetworkPolicy", "hydrant-workers-from-gateway-only")
    selected = policy["spec"]["podSelector"]["matchLabels"]
    for worker in _workers(objects):
        assert selected.items() <= worker["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sources = policy["spec"]["ingress"]
    gateway_rules = [
        r
        for r in sources
        if r["from"][0]
        .get("podSelector", {})
        .get("matchLabels", {})
        .get("app.kubernetes.io/component")
        == "gateway"
        and "namespaceSelector" not in r["from"][0]
    ]
    assert len(gateway_rules) == 1
    # every other rule is Prometheus from the monitoring namespace, nothing open to all
    for rule in sources:
        assert rule["from"], "an empty `from` admits every pod"
        if rule not in gateway_rules:
            peer = rule["from"][0]
            assert peer["namespaceSelector"]["matchLabels"] == {
                "kubernetes.io/metadata.name": "monitoring"
            }


def test_secrets_are_templates_only(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    secrets = by_kind(objects, "Secret")
    assert [s["metadata"]["name"] for s in secrets] == ["hydrant-secrets"]
    data = secrets[0]["stringData"]
    assert {"HYDRANT_SECRET_KEY", "HYDRANT_WORKER_SECRET", "HYDRANT_DATABASE_URL"} <= set(data)
    assert "REPLACE_WITH" in data["HYDRANT_SECRET_KEY"]
    assert "REPLACE_WITH" in data["HYDRANT_WORKER_SECRET"]
    assert "REPLACE_WITH" in data["HYDRANT_DATABASE_URL"]


def test_migrations_run_once_as_a_job(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    job = find(objects, "Job", "hydrant-migrate")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert parse_cli(container["command"]).name == "up"
    config = find(objects, "ConfigMap", "hydrant-config")["data"]
    assert config["HYDRANT_AUTO_MIGRATE"] == "false"  # gateways never race the migration


def test_celery_worker_and_single_beat(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    worker = pod_spec(find(objects, "Deployment", "hydrant-jobs-worker"))
    beat_deployment = find(objects, "Deployment", "hydrant-jobs-beat")
    beat = pod_spec(beat_deployment)
    assert worker is not None and beat is not None
    assert worker["containers"][0]["command"] == ["hydrant", "jobs", "worker"]
    assert beat["containers"][0]["command"] == ["hydrant", "jobs", "beat"]
    assert beat_deployment["spec"]["replicas"] == 1
    assert beat_deployment["spec"]["strategy"]["type"] == "Recreate"


def test_overlay_patches_and_images_applied() -> None:
    objects = render(TREES["example"])
    hpa = find(objects, "HorizontalPodAutoscaler", "hydrant-gateway")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 20)
    assert hpa["spec"]["metrics"]  # merged, not replaced
    config = find(objects, "ConfigMap", "hydrant-config")["data"]
    assert "llama-3-70b=" in config["HYDRANT_MODELS"]
    assert config["HYDRANT_WORKER_POOLS"] == "true"  # the base's keys survive the patch
    small = find(objects, "ScaledObject", "hydrant-worker-llama-3-8b")
    assert small["spec"]["maxReplicaCount"] == 16
    assert len(small["spec"]["triggers"]) == 2
    images = {
        c["image"]
        for d in by_kind(objects, "Deployment")
        for c in (pod_spec(d) or {}).get("containers", [])
    }
    assert images == {
        "registry.example.com/hydrant:1.0.0",
        "registry.example.com/hydrant-cuda:1.0.0",
    }


def test_prometheus_rule_pages_on_kv_saturation(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    rules: dict[str, Any] = {
        r["alert"]: r
        for g in by_kind(objects, "PrometheusRule")[0]["spec"]["groups"]
        for r in g["rules"]
    }
    kv = rules["HydrantKVCacheSaturated"]
    assert "hydrant_kv_cache_usage_perc" in kv["expr"] and kv["expr"].endswith("> 0.95")
    assert kv["for"] == "5m"
    assert kv["labels"]["priority"] == "P1" and kv["labels"]["severity"] == "critical"
    assert "hydrant_pool_waiting_requests" in rules["HydrantPoolQueueBacklog"]["expr"]
    assert "hydrant_quota_refusals_total" in rules["HydrantBudgetExhaustionRate"]["expr"]
    assert "hydrant_ledger_spool_entries" in rules["HydrantLedgerSpoolNotEmpty"]["expr"]
    for rule in rules.values():
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_grafana_dashboard_is_a_labelled_config_map(rendered: tuple[str, list[Obj]]) -> None:
    _, objects = rendered
    config_map = find(objects, "ConfigMap", "hydrant-grafana-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config_map["data"]["hydrant-overview.json"])
    assert dashboard["uid"] == "hydrant-overview"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    assert all(t["expr"] for p in dashboard["panels"] for t in p["targets"])


def test_renderer_refuses_features_it_does_not_implement(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "commonLabels: {a: b}\nresources: []\n"
    )
    with pytest.raises(KustomizeError, match="commonLabels"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: [cm.yaml, cm.yaml]\n", encoding="utf-8"
    )
    (tmp_path / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", encoding="utf-8"
    )
    with pytest.raises(KustomizeError, match="duplicate"):
        render(tmp_path)
    # kustomize's load restrictor: a file above the root is refused (a directory is a base)
    inner = tmp_path / "overlay"
    inner.mkdir()
    (inner / "kustomization.yaml").write_text("resources: [../cm.yaml]\n", encoding="utf-8")
    with pytest.raises(KustomizeError, match="outside"):
        render(inner)


def test_every_setting_is_a_real_one_and_parses(rendered: tuple[str, list[Obj]]) -> None:
    """A misspelt HYDRANT_* variable is silently ignored by the process: catch it here."""
    _, objects = rendered
    env = dict(find(objects, "ConfigMap", "hydrant-config")["data"])
    env.update(find(objects, "Secret", "hydrant-secrets")["stringData"])
    for container in _hydrant_containers(objects):
        env.update({e["name"]: e.get("value", "x") for e in container.get("env", [])})
    known = {"HYDRANT_" + f.name.upper() for f in dataclasses.fields(Settings)}
    assert set(env) <= known, sorted(set(env) - known)
    settings = load_settings(environ=env)
    assert settings.worker_pools and settings.pool_scaler == "none"
    assert not settings.auto_migrate and not settings.embedded_jobs
    assert {m.name for m in settings.served_models()} >= {"llama-3-8b"}
