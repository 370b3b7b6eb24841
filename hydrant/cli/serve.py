"""`hydrant serve`: the API gateway; on the embedded default, everything in one command.

With no pools configured, the engines are this command's own: one child
process per model by default (`HYDRANT_EMBEDDED_ENGINE=process`, so an
engine never shares the GIL with the gateway's event loop), or threads of
this process (`thread`).
"""

from __future__ import annotations

import logging

import click

from hydrant.cli.context import CliContext, pass_context
from hydrant.cli.engine_options import enforce_eager_option, kv_cache_dtype_option
from hydrant.settings import ModelSpec, Settings

log = logging.getLogger("hydrant.serve")


def prepare_embedded(settings: Settings) -> None:
    """Generate the demo model on first start when no model is configured."""
    if settings.models:
        return
    target = settings.demo_model_dir
    if (target / "config.json").is_file():
        return
    from hydrant.engine.demo_model import write_demo_model  # torch: only in this mode

    log.info("no model configured: generating the demo model", extra={"path": str(target)})
    write_demo_model(target, progress=lambda step: log.info("demo model: %s", step))


@click.command()
@click.option("--host", help="Address to listen on (HYDRANT_HOST).")
@click.option("--port", type=int, help="Port to listen on (HYDRANT_PORT).")
@click.option(
    "--model",
    "model_specs",
    multiple=True,
    metavar="NAME=PATH",
    help="Serve this checkpoint directory under NAME (repeatable; HYDRANT_MODELS).",
)
@click.option(
    "--quantization",
    type=click.Choice(["int8", "int4"]),
    help="Quantize float weights on load (HYDRANT_QUANTIZATION).",
)
@click.option(
    "--tool-call-parser",
    "tool_call_parsers",
    multiple=True,
    metavar="NAME=PARSER",
    help="How tool_choice auto reads model NAME's calls: hermes, mistral, llama3_json, or "
    "none to turn it off; default: the format its chat template teaches (repeatable; "
    "HYDRANT_TOOL_CALL_PARSERS).",
)
@kv_cache_dtype_option
@enforce_eager_option
@pass_context
def serve(
    cli: CliContext,
    host: str | None,
    port: int | None,
    model_specs: tuple[str, ...],
    quantization: str | None,
    tool_call_parsers: tuple[str, ...],
    kv_cache_dtype: str | None,
    enforce_eager: bool | None,
) -> None:
    """Run the API gateway: /v1 (OpenAI-compatible), /admin, /ui, /metrics, /healthz, /readyz."""
    import uvicorn

    from hydrant.heap import freeze_heap
    from hydrant.platform.app import create_app
    from hydrant.platform.auth.from_settings import check_auth_settings
    from hydrant.platform.db import migrate
    from hydrant.platform.dispatch.embedded import build_embedded_pools
    from hydrant.platform.http.server_protocol import server_options
    from hydrant.platform.services import build_services, share_gil_with_engines
    from hydrant.runtime import load_embedded_engines

    models = tuple(ModelSpec.parse(spec) for spec in model_specs) or None
    settings = cli.settings(
        host=host,
        port=port,
        models=models,
        quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
        enforce_eager=enforce_eager,
        tool_call_parsers=",".join(tool_call_parsers) or None,
    )
    check_auth_settings(settings)  # a bad key or TTL: refused before any model loads
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    prepare_embedded(settings)
    if settings.auto_migrate:
        migrate.upgrade(settings.effective_database_url)
    engines = None
    children = None
    # Else pools (HYDRANT_WORKER_POOLS, HYDRANT_POOL_BACKENDS), built with the services.
    if not settings.pool_mode and settings.embedded_engine == "process":
        children = build_embedded_pools(settings)
        log.info(
            "starting an engine process per model",
            extra={"models": children.registry.names()},
        )
    elif not settings.pool_mode:  # HYDRANT_EMBEDDED_ENGINE=thread: in this process
        from hydrant.engine.host_memory import retain_freed_memory  # imports torch

        retain_freed_memory()  # the engines' step activations, as in a worker process
        engines = load_embedded_engines(settings)
        share_gil_with_engines()  # the engines' step threads share this interpreter
    if children is not None:
        services = build_services(
            settings,
            registry=children.registry,
            pools=children.manager,
            metric_registries=[children.metrics_registry()],
            run_jobs=True,
        )
        services.background.append(children.supervisor())
        services.on_stop.append(children.cleanup)  # after the pools stopped the children
    else:
        services = build_services(
            settings,
            registry=engines.registry if engines is not None else None,
            metric_registries=engines.metric_registries if engines is not None else (),
            run_jobs=True,
        )
    if engines is not None:
        services.on_stop.append(engines.shutdown)
    app = create_app(settings, services)
    # The imports, the app and any in-process engine live until exit: out of GC scans.
    frozen = freeze_heap()
    log.info(
        "listening", extra={"host": settings.host, "port": settings.port, "frozen_objects": frozen}
    )
    uvicorn.run(app, host=settings.host, port=settings.port, **server_options(settings))
