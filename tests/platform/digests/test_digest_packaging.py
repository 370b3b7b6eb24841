"""The digest templates travel with the package (setuptools package data), not only the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hydrant.platform.digests.render import environment

ROOT = Path(__file__).resolve().parents[3]


def test_templates_are_package_data(tmp_path: Path) -> None:
    names = set(environment().list_templates())
    assert {"tenant_digest.txt", "tenant_digest.html", "admin_digest.html"} <= names
    # -P: the checkout's top-level `kernels/` must not shadow the `kernels` distribution
    # (transformers >= 5.25 installs it), whose egg_info writer setuptools loads.
    subprocess.run(
        [sys.executable, "-P", "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )
    built = tmp_path / "hydrant" / "platform" / "digests" / "templates"
    assert {p.name for p in built.iterdir()} >= names
