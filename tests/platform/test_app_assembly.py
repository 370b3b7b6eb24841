"""The app is assembled in one place: one list of controllers, services handed in by `Provide`.

Why these guard the shape and not only behaviour: a route registered after the
app is built, or a handler that fishes a service out of `app.state` by name,
works until the day the name or the build order changes; these tests fail the
day such a path is added.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from litestar import Controller, Litestar, Router, get
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler

from hydrant.platform.app import controllers, create_app
from hydrant.platform.auth.context import SERVICES_STATE_KEY
from hydrant.platform.models.registry import ModelRegistry
from hydrant.platform.services import Services, build_services
from hydrant.settings import ModelSpec, load_settings

ROOT = Path(__file__).resolve().parents[2]
# The assembly, which puts the services object in the state; the one reader of it for
# guards (which run before injection); the one accessor for tests and tools that hold
# only an app.
STATE_READERS = {
    ROOT / "platform/app.py",
    ROOT / "platform/auth/context.py",
    ROOT / "platform/services.py",
}


def _handler_fns(item: Any) -> Iterator[Any]:
    """Every handler function declared by an entry of the controllers list, recursively."""
    if isinstance(item, Router):
        for route in item.routes:
            for handler in getattr(route, "route_handlers", ()):
                yield handler.fn
    elif isinstance(item, type) and issubclass(item, Controller):
        for value in vars(item).values():
            if isinstance(value, BaseRouteHandler):
                yield value.fn
    elif isinstance(item, BaseRouteHandler):
        yield item.fn
    else:
        raise AssertionError(f"unexpected entry in the controllers list: {item!r}")


def _name(fn: Any) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def _registered_fns(app: Litestar) -> Iterator[Any]:
    """The handlers of the app's routes, less Litestar's own (OPTIONS, the schema pages
    that `openapi_config` asks for, static files' generated handlers)."""
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if not handler.fn.__module__.startswith("litestar."):
                yield handler.fn


def _services(kind: str, data_dir: Path, model_dir: Path) -> Services:
    if kind == "control plane":
        return build_services(load_settings({}, data_dir=data_dir), models=())
    if kind == "embedded":
        settings = load_settings({}, data_dir=data_dir)
        return build_services(settings, registry=ModelRegistry(), models=())
    settings = load_settings(  # worker pools: nothing connects until the app starts
        {},
        data_dir=data_dir,
        models=(ModelSpec("demo", model_dir),),
        worker_pools=True,
        redis_url="redis://127.0.0.1:1/0",
        worker_secret="w" * 32,
    )
    return build_services(settings, models=())


@pytest.mark.parametrize("kind", ["control plane", "embedded", "worker pools"])
def test_every_route_is_registered_from_the_one_list(
    kind: str, data_dir: Path, demo_model_dir: Path
) -> None:
    services = _services(kind, data_dir, demo_model_dir)
    listed = {_name(fn) for item in controllers(services) for fn in _handler_fns(item)}
    app = create_app(services.settings, services)
    registered = {_name(fn) for fn in _registered_fns(app)}
    assert len(registered) > 20, "the app serves (almost) no route"
    outside = registered - listed
    assert not outside, f"routes registered outside `controllers()`: {sorted(outside)}"
    paths = {route.path for route in app.routes}
    assert ("/v1/chat/completions" in paths) == (kind != "control plane")
    assert ("/admin/pools" in paths) == (kind == "worker pools")


def test_the_state_holds_the_services_object_alone(data_dir: Path, demo_model_dir: Path) -> None:
    services = _services("embedded", data_dir, demo_model_dir)
    app = create_app(services.settings, services)
    assert isinstance(app.state, State)
    assert dict(app.state) == {SERVICES_STATE_KEY: services}


def test_no_handler_takes_the_state(data_dir: Path, demo_model_dir: Path) -> None:
    """A handler gets its services by `Provide`; a `state` parameter would hand it all."""
    services = _services("worker pools", data_dir, demo_model_dir)
    app = create_app(services.settings, services)
    taking = sorted(
        _name(fn)
        for fn in _registered_fns(app)
        if "state" in inspect.signature(fn).parameters
        or any(p.annotation in (State, "State") for p in inspect.signature(fn).parameters.values())
    )
    assert not taking, f"handlers that read app.state: {taking}"


def _reads_app_state(path: Path) -> list[int]:
    """Lines of `path` that read `<something>.app.state`, `app.state` or a `State` value."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "state":
            base = node.value
            named_app = isinstance(base, ast.Name) and base.id == "app"
            attr_app = isinstance(base, ast.Attribute) and base.attr == "app"
            if named_app or attr_app:
                lines.append(node.lineno)
        imports_state = isinstance(node, ast.ImportFrom) and any(
            alias.name == "State" for alias in node.names
        )
        if imports_state and node.module == "litestar.datastructures":  # type: ignore[union-attr]
            lines.append(node.lineno)
    return lines


def test_no_module_reads_services_from_the_app_state() -> None:
    """Outside the two sanctioned readers, no module of the gateway touches `app.state`."""
    offenders = {
        str(path.relative_to(ROOT)): lines
        for folder in ("platform", "web")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in STATE_READERS and (lines := _reads_app_state(path))
    }
    assert not offenders, f"modules reading app.state (use Provide): {offenders}"


def test_the_state_check_finds_a_reader(tmp_path: Path) -> None:
    """The source check above can fail: a handler written the old way is caught."""
    module = tmp_path / "old_way.py"
    module.write_text(
        "from litestar.datastructures import State\n"
        "def handler(request):\n"
        "    return request.app.state.registry\n"
    )
    assert _reads_app_state(module) == [1, 3]


def test_the_route_check_finds_a_late_registration(data_dir: Path, demo_model_dir: Path) -> None:
    """The route check above can fail: a controller registered after the build is caught."""
    services = _services("control plane", data_dir, demo_model_dir)
    listed = {_name(fn) for item in controllers(services) for fn in _handler_fns(item)}
    app = create_app(services.settings, services)

    class LateController(Controller):
        path = "/late"

        @get("/")
        async def late(self) -> None:
            return None

    app.register(LateController)
    outside = {_name(fn) for fn in _registered_fns(app)} - listed
    assert outside == {_name(LateController.late.fn)}
