"""`hydrant worker`: one engine on one device, serving a model's pool (issue #6)."""

from __future__ import annotations

from pathlib import Path

import click

from hydrant.cli.context import CliContext, pass_context
from hydrant.cli.engine_options import enforce_eager_option, kv_cache_dtype_option


@click.command()
@click.option("--model", required=True, help="Model name to serve (the pool it joins).")
@click.option(
    "--path",
    "model_path",
    envvar="HYDRANT_WORKER_PATH",
    type=click.Path(path_type=Path),
    help="Checkpoint directory (default: the path HYDRANT_MODELS gives the model).",
)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=0, help="Port of the internal HTTP API (0: any free).")
@click.option(
    "--quantization",
    type=click.Choice(["int8", "int4"]),
    envvar="HYDRANT_WORKER_QUANTIZATION",
    help="Quantize float weights on load.",
)
@click.option(
    "--parent-pid",
    type=int,
    envvar="HYDRANT_WORKER_PARENT_PID",
    hidden=True,  # set by `hydrant serve` for the engine children it starts itself
    help="Drain and exit when this process (the gateway that started us) is gone.",
)
@kv_cache_dtype_option
@enforce_eager_option
@pass_context
def worker(
    cli: CliContext,
    model: str,
    model_path: Path | None,
    device: str,
    host: str,
    port: int,
    quantization: str | None,
    parent_pid: int | None,
    kv_cache_dtype: str | None,
    enforce_eager: bool | None,
) -> None:
    """Run one engine worker: one model on one device, registered in Redis.

    The gateway dispatches to pools of these processes; they scale to zero
    and wake with weights kept warm in host memory. Needs HYDRANT_REDIS_URL
    (or HYDRANT_WORKER_REGISTRY_DIR, a gateway on this machine) and
    HYDRANT_WORKER_SECRET (the gateway's). SIGTERM drains, then exits 0.
    """
    settings = cli.settings()
    if not settings.redis_url and settings.worker_registry_dir is None:
        raise click.UsageError("a worker registers in Redis: set HYDRANT_REDIS_URL")
    if not settings.worker_secret:
        raise click.UsageError("set HYDRANT_WORKER_SECRET (the secret the gateway sends)")
    if model_path is None:
        known = {spec.name: spec.path for spec in settings.served_models()}
        if model not in known:
            raise click.UsageError(f"no path for model {model!r}: pass --path or HYDRANT_MODELS")
        model_path = known[model]
    if not (model_path / "config.json").is_file():
        raise click.UsageError(f"{model_path} is not a checkpoint directory (no config.json)")

    from hydrant.engine.engine_config import default_background_step_tokens, default_max_num_seqs
    from hydrant.engine.worker.process import run_worker
    from hydrant.engine.worker.registration import RegistryTarget
    from hydrant.engine.worker.runtime import WorkerOptions

    options = WorkerOptions(
        model=model,
        path=str(model_path),
        secret=settings.worker_secret,
        device=device,
        dtype=settings.dtype,
        kv_cache_bytes=settings.kv_cache_bytes,
        max_num_seqs=settings.max_num_seqs or default_max_num_seqs(device),
        long_lane_tokens=settings.long_lane_tokens,
        quantization=quantization or settings.quantization,
        kv_cache_dtype=kv_cache_dtype or settings.kv_cache_dtype,
        enforce_eager=enforce_eager or settings.enforce_eager,
        enable_prefix_caching=settings.enable_prefix_caching,
        num_threads=settings.engine_threads,
        max_prefill_tokens_while_decoding=settings.max_prefill_tokens_while_decoding,
        max_background_step_tokens=default_background_step_tokens(
            settings.max_background_step_tokens, device
        )
        or 0,
        max_loras=settings.max_loras,
        max_cpu_loras=settings.max_cpu_loras,
        max_lora_rank=settings.max_lora_rank,
        host=host,
        port=port,
        advertise_host=settings.worker_advertise_host,
        advertise_port=settings.worker_advertise_port,
        drain_timeout_s=settings.worker_drain_timeout_s,
        keepalive_s=settings.worker_keepalive_s,
        freeze_heap=True,  # this process serves until it exits: its startup heap is static
    )
    registry = RegistryTarget(
        redis_url=settings.redis_url,
        prefix=settings.worker_registry_prefix,
        directory=settings.worker_registry_dir,
    )
    code = run_worker(
        options,
        registry,
        settings.worker_heartbeat_s,
        settings.worker_heartbeat_ttl_s,
        parent_pid=parent_pid,
    )
    raise SystemExit(code)
