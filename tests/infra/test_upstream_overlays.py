"""The vLLM overlays (infra/k8s/overlays/vllm-tp8, vllm-multinode), rendered offline: what
makes them a Hydrant upstream pool that scales from zero, beyond schema validity (that is
test_manifests.py's, for every tree).

The gateway's config is read by the real settings parser, so the URL in
HYDRANT_POOL_BACKENDS is checked against the Service it must name; the KEDA query is
compared with the Hydrant worker pool's, so both pools scale on the same gateway metric."""

from __future__ import annotations

import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from infra_render import Obj, by_kind, find, pod_templates, render

from hydrant.settings import load_settings

K8S = Path(__file__).resolve().parents[2] / "infra" / "k8s"
# overlay -> (model, workload kind, workload name)
OVERLAYS = {
    "vllm-tp8": ("llama-3-70b", "Deployment", "vllm-llama-3-70b"),
    "vllm-multinode": ("llama-3-405b", "LeaderWorkerSet", "vllm-llama-3-405b"),
}


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Obj]]:
    return request.param, render(K8S / "overlays" / request.param)


def _serving_template(objects: list[Obj], kind: str, name: str) -> Obj:
    """The pod template that serves HTTP: the Deployment's, or the LeaderWorkerSet's leader."""
    return pod_templates(find(objects, kind, name))[0]


def _argv(container: Obj) -> list[str]:
    """The command line, with a `sh -c` script split into words."""
    command = container["command"]
    return shlex.split(command[2]) if command[:2] == ["sh", "-c"] else list(command)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_gateway_routes_the_model_to_the_vllm_service(overlay: tuple[str, list[Obj]]) -> None:
    tree, objects = overlay
    model, kind, name = OVERLAYS[tree]
    config = find(objects, "ConfigMap", "hydrant-config")["data"]
    secrets = find(objects, "Secret", "hydrant-secrets")["stringData"]
    settings = load_settings(environ={**config, **secrets})
    upstream = settings.upstream_pools()
    assert set(upstream) == {model}
    assert model in {m.name for m in settings.served_models()}  # its tokenizer's directory
    assert settings.upstream_api_key == secrets["HYDRANT_UPSTREAM_API_KEY"]
    (url,) = upstream[model].urls
    host_port = urlsplit(url)
    service = find(objects, "Service", host_port.hostname or "")
    assert host_port.port in [p["port"] for p in service["spec"]["ports"]]
    # the Service reaches the pods that serve HTTP, and only those (not a group's workers)
    selector = service["spec"]["selector"].items()
    templates = pod_templates(find(objects, kind, name))
    assert selector <= templates[0]["metadata"]["labels"].items()
    assert all(not selector <= t["metadata"]["labels"].items() for t in templates[1:])
    serving = templates[0]["spec"]["containers"][0]
    assert int(_flag(_argv(serving), "--port")) == serving["ports"][0]["containerPort"]
    # vLLM gets the same key the gateway sends, as its VLLM_API_KEY (= `--api-key`), optional
    (key_env,) = [e for e in serving["env"] if e["name"] == "VLLM_API_KEY"]
    ref = key_env["valueFrom"]["secretKeyRef"]
    assert (ref["key"], ref["optional"]) == ("HYDRANT_UPSTREAM_API_KEY", True)


def test_vllm_runs_tensor_parallel_on_eight_gpus(overlay: tuple[str, list[Obj]]) -> None:
    tree, objects = overlay
    model, kind, name = OVERLAYS[tree]
    for template in pod_templates(find(objects, kind, name)):
        spec = template["spec"]
        container = spec["containers"][0]
        assert container["image"].startswith("vllm/vllm-openai:")
        for side in ("requests", "limits"):
            assert container["resources"][side]["nvidia.com/gpu"] == 8
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
        claim = volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"]
        assert claim == "hydrant-models"
    serving = _serving_template(objects, kind, name)["spec"]["containers"][0]
    argv = _argv(serving)
    serve = argv.index("serve")
    assert argv[serve - 1] == "vllm"
    assert _flag(argv, "--served-model-name") == model  # the name the gateway health-checks
    assert _flag(argv, "--tensor-parallel-size") == "8"
    assert "--enable-prompt-tokens-details" in argv  # cached tokens billed at the cached price
    for probe in ("startupProbe", "readinessProbe"):
        assert serving[probe]["httpGet"]["path"] == "/health"


def test_multinode_is_a_two_node_ray_group() -> None:
    objects = render(K8S / "overlays" / "vllm-multinode")
    group = find(objects, "LeaderWorkerSet", "vllm-llama-3-405b")
    template = group["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"  # Ray cannot rejoin
    leader, worker = (t["spec"]["containers"][0] for t in pod_templates(group))
    argv = _argv(leader)
    # the Ray head waits for the whole group, then vLLM serves across both nodes
    assert argv[:3] == [
        "bash",
        "/vllm-workspace/examples/online_serving/multi-node-serving.sh",
        "leader",
    ]
    assert "--ray_cluster_size=$(LWS_GROUP_SIZE)" in argv
    assert argv.index("--ray_cluster_size=$(LWS_GROUP_SIZE)") < argv.index("serve")
    assert _flag(argv, "--pipeline-parallel-size") == "2"
    assert _flag(argv, "--distributed-executor-backend") == "ray"
    worker_argv = _argv(worker)
    assert worker_argv[-2:] == ["worker", "--ray_address=$(LWS_LEADER_ADDRESS)"]
    assert "serve" not in worker_argv


def test_keda_scales_vllm_from_zero_on_the_worker_pools_queue_metric(
    overlay: tuple[str, list[Obj]],
) -> None:
    tree, objects = overlay
    model, kind, name = OVERLAYS[tree]
    workload = find(objects, kind, name)
    assert workload["spec"]["replicas"] == 0  # KEDA owns the count from here
    scaled = find(objects, "ScaledObject", name)
    assert scaled["spec"]["scaleTargetRef"]["kind"] == kind
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    assert scaled["spec"]["minReplicaCount"] == 0
    queue = {t["name"]: t for t in scaled["spec"]["triggers"]}["queue"]
    assert queue["metadata"]["activationThreshold"] == "0"  # one waiting request wakes it
    worker_pool = find(render(K8S / "base"), "ScaledObject", "hydrant-worker-llama-3-8b")
    worker_queue = {t["name"]: t for t in worker_pool["spec"]["triggers"]}["queue"]
    expected = worker_queue["metadata"]["query"].replace('"llama-3-8b"', f'"{model}"')
    assert queue["metadata"]["query"] == expected
    assert queue["metadata"]["serverAddress"] == worker_queue["metadata"]["serverAddress"]


def test_only_the_gateway_reaches_vllm(overlay: tuple[str, list[Obj]]) -> None:
    tree, objects = overlay
    _, kind, name = OVERLAYS[tree]
    policy = find(objects, "NetworkPolicy", "vllm-from-gateway-only")
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    for template in pod_templates(find(objects, kind, name)):
        assert selected <= template["metadata"]["labels"].items()
    port = _serving_template(objects, kind, name)["spec"]["containers"][0]["ports"][0]
    peers = []
    for rule in policy["spec"]["ingress"]:
        assert [p["port"] for p in rule["ports"]] == [port["containerPort"]]
        peers.append(rule["from"][0])
    gateway = find(objects, "Deployment", "hydrant-gateway")
    gateway_labels = gateway["spec"]["template"]["metadata"]["labels"].items()
    assert peers[0]["podSelector"]["matchLabels"].items() <= gateway_labels
    assert peers[1]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    assert len(peers) == 2
    # the Hydrant workers' policy does not select vLLM (it would admit only port 8100)
    workers = find(objects, "NetworkPolicy", "hydrant-workers-from-gateway-only")
    worker_selector = workers["spec"]["podSelector"]["matchLabels"].items()
    for template in pod_templates(find(objects, kind, name)):
        assert not worker_selector <= template["metadata"]["labels"].items()
    assert by_kind(objects, "ScaledObject")  # and the worker pool's ScaledObject is still there


def test_the_tp8_vllm_sleeps_when_idle_before_keda_scales_it_to_zero() -> None:
    """Sleep mode on both sides: vLLM started to sleep (its dev mode, the only one with
    the routes), the gateway told to use it, and the sleep due before KEDA's cooldown
    would take the pod away (else the wake in seconds never gets its chance)."""
    model, kind, name = OVERLAYS["vllm-tp8"]
    objects = render(K8S / "overlays" / "vllm-tp8")
    config = find(objects, "ConfigMap", "hydrant-config")["data"]
    settings = load_settings(environ=config)
    assert settings.upstream_pools()[model].sleep
    serving = _serving_template(objects, kind, name)["spec"]["containers"][0]
    assert "--enable-sleep-mode" in _argv(serving)
    env = {e["name"]: e.get("value") for e in serving["env"]}
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    cooldown = find(objects, "ScaledObject", name)["spec"]["cooldownPeriod"]
    assert 0 < settings.pool_idle_timeout_s < cooldown
    # the multi-node group does not sleep (Ray across nodes: not tried with sleep mode)
    multinode = render(K8S / "overlays" / "vllm-multinode")
    other = load_settings(environ=find(multinode, "ConfigMap", "hydrant-config")["data"])
    assert not other.upstream_sleep_models()
