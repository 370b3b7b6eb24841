"""The compose stack and the Dockerfiles, checked by parsing (docker does not run here):
every `hydrant ...` command line is one the real CLI accepts, and the images install
torch==2.13.0 before the package."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from infra_cli import parse_cli

from hydrant.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "infra" / "compose" / "compose.yaml"
DOCKERFILES = {
    "cpu": ROOT / "infra" / "docker" / "Dockerfile.cpu",
    "cuda": ROOT / "infra" / "docker" / "Dockerfile.cuda",
}
TORCH = "torch==2.13.0"


def test_parse_cli_rejects_bad_lines() -> None:
    with pytest.raises(AssertionError, match="no command"):
        parse_cli(["hydrant", "wrker", "--model", "x"])
    with pytest.raises(click.UsageError):
        parse_cli(["hydrant", "worker", "--model", "x", "--gpu", "0"])
    with pytest.raises(click.UsageError):
        parse_cli(["hydrant", "worker", "--device", "cpu"])  # --model is required
    assert parse_cli(["hydrant", "jobs", "beat"]).name == "beat"


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_compose_services_run_real_hydrant_commands() -> None:
    services = _compose()["services"]
    commands = {name: s["command"] for name, s in services.items() if "command" in s}
    hydrant = {name: c for name, c in commands.items() if c[0] == "hydrant"}
    resolved = {name: parse_cli(c).name for name, c in hydrant.items()}
    assert resolved == {
        "demo-model": "demo-model",
        "migrate": "up",
        "gateway": "serve",
        "worker-1": "worker",
        "worker-2": "worker",
        "jobs-worker": "worker",
        "jobs-beat": "beat",
    }
    assert commands["jobs-worker"][:3] == ["hydrant", "jobs", "worker"]


def test_compose_wiring() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"postgres", "redis"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith((".", "/")):
                assert source in compose["volumes"], f"{name}: undeclared volume {source}"
    hosts = set()
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        env = worker["environment"]
        # workers register the address the gateway dials: their own service name
        assert env["HYDRANT_WORKER_ADVERTISE_HOST"] == worker["hostname"] == name
        assert env["HYDRANT_REDIS_URL"].startswith("redis://redis:")
        hosts.add(worker["hostname"])
        assert worker["env_file"] == ".env"  # the secrets are not in the file
    assert len(hosts) == 2
    gateway = services["gateway"]
    assert gateway["environment"]["HYDRANT_WORKER_POOLS"] == "true"
    assert gateway["ports"] == ["127.0.0.1:8000:8000"]
    text = COMPOSE.read_text(encoding="utf-8")
    assert "HYDRANT_SECRET_KEY" not in text and "HYDRANT_WORKER_SECRET" not in text
    example = (COMPOSE.parent / "env.example").read_text(encoding="utf-8")
    assert re.search(r"^HYDRANT_SECRET_KEY=$", example, re.M)
    assert re.search(r"^HYDRANT_WORKER_SECRET=$", example, re.M)


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", path.read_text(encoding="utf-8"))
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("variant", sorted(DOCKERFILES))
def test_dockerfile_installs_pinned_torch_before_the_package(variant: str) -> None:
    steps = instructions(DOCKERFILES[variant])
    assert steps[0][0] == "FROM"
    runs = [(i, args) for i, (word, args) in enumerate(steps) if word == "RUN"]
    torch_at = [i for i, args in runs if TORCH in shlex.split(args)]
    package_at = [i for i, args in runs if re.search(r"pip install \.(\s|$)", args)]
    assert torch_at and package_at, f"{variant}: torch {torch_at}, package {package_at}"
    assert torch_at[0] < package_at[0]
    index = "/whl/cpu" if variant == "cpu" else "/whl/cu"
    assert index in steps[torch_at[0]][1]  # the CPU or CUDA wheel, never PyPI's default
    copies = [args.split()[0] for word, args in steps if word == "COPY"]
    for package in ("hydrant", "platform", "engine", "kernels", "web", "migrations"):
        assert package in copies, f"{variant}: {package}/ is not copied"
        assert (ROOT / package).is_dir()
    assert "pyproject.toml" in copies
    user = [args for word, args in steps if word == "USER"]
    assert user and user[-1] != "root"  # the server does not run as root
    cmd = next(args for word, args in reversed(steps) if word == "CMD")
    parse_cli(yaml.safe_load(cmd))  # the default command is a real one


def test_compose_settings_are_real_ones_and_parse() -> None:
    known = {"HYDRANT_" + f.name.upper() for f in dataclasses.fields(Settings)}
    example = (COMPOSE.parent / "env.example").read_text(encoding="utf-8")
    secrets = {
        line.split("=", 1)[0]: "s3cret-value"
        for line in example.splitlines()
        if line and not line.startswith("#")
    }
    assert set(secrets) <= known, sorted(set(secrets) - known)
    for name, service in _compose()["services"].items():
        env = service.get("environment", {})
        if not any(k.startswith("HYDRANT_") for k in env):
            continue
        assert set(env) <= known, (name, sorted(set(env) - known))
        settings = load_settings(environ={**env, **secrets})
        assert settings.worker_pools and settings.pool_scaler == "none"
        assert [m.name for m in settings.served_models()] == ["demo"]
