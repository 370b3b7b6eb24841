"""The `platform/` trap of DESIGN.md and the dependency direction, checked for real."""

from __future__ import annotations

import ast
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def test_stdlib_platform_is_not_shadowed_from_repository_root() -> None:
    out = _run("import platform, uuid; print(platform.system()); print(platform.__file__)")
    system, location = out.splitlines()
    assert system == "Linux" or system in {"Darwin", "Windows"}
    assert not Path(location).resolve().is_relative_to(ROOT), location


def test_platform_folder_has_no_init() -> None:
    assert not (ROOT / "platform" / "__init__.py").exists()


def _mapped_folders() -> list[str]:
    """The repository's top folders that install as `hydrant.<name>`: setup.py's ROOTS."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "ROOTS":
            roots = ast.literal_eval(node.value)
            return [folder for name, folder in roots.items() if name != "hydrant"]
    raise AssertionError("setup.py has no ROOTS")


def test_no_package_folder_shadows_an_installed_distribution() -> None:
    """A top folder holding an `__init__.py` is a regular package named like the folder
    whenever the root is on `sys.path`, and wins over any installed module of that name (as
    `kernels/` did over Hugging Face's `kernels`, which transformers imports when it builds a
    model). A folder without one is a namespace portion, which an installed package beats."""
    installed = importlib.metadata.packages_distributions()
    clashes = [
        f"{name}/ (the import name of {', '.join(installed[name])})"
        for name in _mapped_folders()
        if name in installed and (ROOT / name / "__init__.py").exists()
    ]
    assert not clashes, clashes


@pytest.mark.parametrize(
    "name",
    [n for n in _mapped_folders() if n in importlib.metadata.packages_distributions()],
)
def test_installed_namesake_imports_from_repository_root(name: str) -> None:
    out = _run(f"import {name}; print({name}.__file__)")
    assert not Path(out).resolve().is_relative_to(ROOT / name), out


def test_transformers_builds_a_model_from_repository_root() -> None:
    """What broke: transformers imports `kernels` while it builds any model."""
    out = _run(
        "from transformers import LlamaConfig, LlamaForCausalLM;"
        "LlamaForCausalLM(LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,"
        " num_attention_heads=2, num_key_value_heads=1, vocab_size=64)); print('built')"
    )
    assert out.splitlines()[-1] == "built"


def test_hydrant_platform_imports_as_namespace_package() -> None:
    out = _run("import hydrant.platform, hydrant.platform.app as a; print(a.__file__)")
    assert Path(out).resolve() == ROOT / "platform" / "app.py"


def test_control_plane_never_imports_torch() -> None:
    out = _run(
        "import sys, hydrant.platform.app, hydrant.platform.health.service, hydrant.cli.main;"
        "print('torch' in sys.modules)"
    )
    assert out == "False"
