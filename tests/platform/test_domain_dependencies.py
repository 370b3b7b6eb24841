"""The platform's domains point one way: no import cycle between them (DESIGN.md).

A domain is a package under `platform/` (a top-level module there, such as the
app's assembly, counts as its own). Why a test: a cycle between two domains
means neither can be understood, changed or tested without the other, and one
import added in passing is enough to make one.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLATFORM = ROOT / "platform"
# Below the inference API: none of these may import it (it builds on them).
BELOW_INFERENCE = (
    "auth",
    "billing",
    "credits",
    "db",
    "ledger",
    "metrics",
    "quotas",
    "tenants",
    "keys",
)


def _domain(path: Path, platform: Path) -> str:
    return path.relative_to(platform).parts[0].removesuffix(".py")


def _imported_modules(path: Path) -> Iterable[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:  # `from hydrant.platform import server_secret`
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def domain_graph(platform: Path = PLATFORM) -> dict[str, dict[str, set[str]]]:
    """domain -> imported domain -> the files that import it."""
    graph: dict[str, dict[str, set[str]]] = {}
    for path in sorted(platform.rglob("*.py")):
        source = _domain(path, platform)
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[:2] != ["hydrant", "platform"] or len(parts) < 3:
                continue
            target = parts[2]
            if target != source:
                graph.setdefault(source, {}).setdefault(target, set()).add(
                    str(path.relative_to(platform))
                )
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected groups of more than one domain (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_platform_domains() -> None:
    graph = domain_graph()
    found = cycles(graph)
    detail = [
        f"{a} -> {b}: {sorted(graph[a][b])}"
        for group in found
        for a in group
        for b in group
        if b in graph.get(a, {})
    ]
    assert not found, f"import cycles between domains: {found}\n" + "\n".join(detail)


def test_no_lower_layer_imports_the_inference_api() -> None:
    graph = domain_graph()
    offenders = {
        d: sorted(graph[d]["inference"]) for d in BELOW_INFERENCE if "inference" in graph.get(d, {})
    }
    assert not offenders, offenders


def test_auth_imports_no_other_domains_controllers() -> None:
    imports = [
        module
        for path in (PLATFORM / "auth").rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith("hydrant.platform.")
        and not module.startswith("hydrant.platform.auth")
        and "controllers" in module
    ]
    assert not imports, imports


def test_the_cycle_check_finds_a_cycle(tmp_path: Path) -> None:
    """The check above can fail: two domains importing each other are a cycle."""
    for a, b in (("alpha", "beta"), ("beta", "alpha")):
        (tmp_path / a).mkdir(exist_ok=True)
        (tmp_path / a / "service.py").write_text(f"from hydrant.platform.{b}.service import x\n")
    (tmp_path / "gamma.py").write_text("from hydrant.platform.alpha.service import x\n")
    assert cycles(domain_graph(tmp_path)) == [["alpha", "beta"]]
