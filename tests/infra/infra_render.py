"""A minimal, offline kustomize: just the features infra/k8s uses, and loud about the rest.

The real `kustomize` binary is not installable from PyPI or Debian here, so
the tests render base + overlay with this: `resources` (files and
directories), `namespace`, `labels` (metadata only), `images`,
`configMapGenerator` (files, hash suffix disabled) and `patches` (by path;
strategic-merge-like: maps merge, lists of named maps merge by name, other
lists are replaced). A key it does not implement raises, so a manifest never
silently relies on a feature the test does not render.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]

SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
    "patches",
}
# kinds without a namespace (the only ones infra/ uses)
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume"}
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}


class KustomizeError(Exception):
    pass


def load_documents(path: Path) -> list[Obj]:
    docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise KustomizeError(f"{path}: every document needs apiVersion and kind")
    return docs


def key(obj: Obj) -> tuple[str, str, str]:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    return group, obj["kind"], obj["metadata"]["name"]


def render(directory: Path) -> list[Obj]:
    """The objects `kustomize build directory` would print, in resource order."""
    directory = Path(directory)
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(spec) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError(f"{directory}: kustomization keys not rendered here: {unknown}")
    objects: list[Obj] = []
    for resource in spec.get("resources", []):
        path = (directory / resource).resolve()
        objects.extend(render(path) if path.is_dir() else load_documents(_inside(directory, path)))
    for generator in spec.get("configMapGenerator", []):
        objects.append(_config_map(directory, generator))
    seen: set[tuple[str, str, str]] = set()
    for obj in objects:
        if key(obj) in seen:
            raise KustomizeError(f"{directory}: duplicate object {key(obj)}")
        seen.add(key(obj))
    for patch in spec.get("patches", []):
        _apply_patch(directory, patch, objects)
    for obj in objects:
        _apply_images(obj, spec.get("images", []))
        _apply_labels(obj, spec.get("labels", []))
        if "namespace" in spec:
            _apply_namespace(obj, spec["namespace"])
    return objects


def _config_map(directory: Path, generator: Obj) -> Obj:
    options = generator.get("options", {})
    if not options.get("disableNameSuffixHash"):
        raise KustomizeError("configMapGenerator without disableNameSuffixHash is not rendered")
    if set(generator) - {"name", "files", "options"}:
        raise KustomizeError(f"configMapGenerator keys not rendered: {set(generator)}")
    data = {}
    for entry in generator.get("files", []):
        path = directory / entry
        data[path.name] = path.read_text(encoding="utf-8")
    metadata: Obj = {"name": generator["name"]}
    if options.get("labels"):
        metadata["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _apply_patch(directory: Path, patch: Obj, objects: list[Obj]) -> None:
    if set(patch) != {"path"}:
        raise KustomizeError(f"only `patches: - path:` is rendered, got {patch}")
    for doc in load_documents(_inside(directory, (directory / patch["path"]).resolve())):
        matches = [o for o in objects if key(o) == key(doc)]
        if len(matches) != 1:
            raise KustomizeError(f"patch {patch['path']} targets {key(doc)}: {len(matches)} found")
        merged = merge(matches[0], doc)
        matches[0].clear()
        matches[0].update(merged)


def _inside(directory: Path, path: Path) -> Path:
    """kustomize's load restrictor: a file (not a kustomization) must lie under the root."""
    if not path.is_relative_to(directory.resolve()):
        raise KustomizeError(f"{directory}: {path} is outside the kustomization's root")
    return path


def merge(base: Any, patch: Any) -> Any:
    """Strategic-merge-like: maps merge; lists of maps with `name` merge by name."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if (
        isinstance(base, list)
        and isinstance(patch, list)
        and all(isinstance(i, dict) and "name" in i for i in [*base, *patch])
    ):
        out_list = copy.deepcopy(base)
        for item in patch:
            found = [i for i, b in enumerate(out_list) if b["name"] == item["name"]]
            if found:
                out_list[found[0]] = merge(out_list[found[0]], item)
            else:
                out_list.append(copy.deepcopy(item))
        return out_list
    return copy.deepcopy(patch)


def pod_spec(obj: Obj) -> Obj | None:
    if obj["kind"] in POD_TEMPLATE_KINDS:
        return obj["spec"]["template"]["spec"]
    return None


def pod_templates(obj: Obj) -> list[Obj]:
    """The pod templates (metadata + spec) of a workload: one, or a LeaderWorkerSet's two."""
    if obj["kind"] in POD_TEMPLATE_KINDS:
        return [obj["spec"]["template"]]
    if obj["kind"] == "LeaderWorkerSet":
        group = obj["spec"]["leaderWorkerTemplate"]
        return [t for t in (group.get("leaderTemplate"), group["workerTemplate"]) if t]
    return []


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def _apply_images(obj: Obj, images: list[Obj]) -> None:
    # kustomize's image fields are `spec/template/spec/...`: a LeaderWorkerSet's templates
    # (spec/leaderWorkerTemplate/...) keep the image they name.
    spec = pod_spec(obj)
    if spec is None:
        return
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        name = container["image"].split("@")[0].rsplit(":", 1)[0]
        for image in images:
            if image["name"] == name:
                tag = image.get("newTag", "latest")
                container["image"] = f"{image.get('newName', name)}:{tag}"


def _apply_labels(obj: Obj, labels: list[Obj]) -> None:
    for entry in labels:
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise KustomizeError("labels into selectors/templates are not rendered")
        obj["metadata"].setdefault("labels", {}).update(entry["pairs"])


def _apply_namespace(obj: Obj, namespace: str) -> None:
    if obj["kind"] == "Namespace":
        obj["metadata"]["name"] = namespace  # kustomize renames the Namespace object too
    elif obj["kind"] not in CLUSTER_SCOPED:
        obj["metadata"]["namespace"] = namespace
