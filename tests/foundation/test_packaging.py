"""The `platform/` trap of DESIGN.md and the dependency direction, checked for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_hydrant_platform_imports_as_namespace_package() -> None:
    out = _run("import hydrant.platform, hydrant.platform.app as a; print(a.__file__)")
    assert Path(out).resolve() == ROOT / "platform" / "app.py"


def test_control_plane_never_imports_torch() -> None:
    out = _run(
        "import sys, hydrant.platform.app, hydrant.platform.health.service, hydrant.cli.main;"
        "print('torch' in sys.modules)"
    )
    assert out == "False"
