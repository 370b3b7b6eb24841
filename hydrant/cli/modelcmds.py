"""Model commands: list what is served, LoRA adapters, the demo model, KV cache sizing."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hydrant.cli.admin import _emit, _run, json_option
from hydrant.cli.context import CliContext, pass_context

if TYPE_CHECKING:
    from hydrant.platform.console import AdminServices


@click.group()
def models() -> None:
    """Models the gateway serves; quantize checkpoints."""


@models.command("list")
@pass_context
def models_list(cli: CliContext) -> None:
    """List configured models, whether each checkpoint can be served, and what serves it.

    The last column is the pool's kind: `hydrant` (Hydrant's engines) or, for a model in
    HYDRANT_POOL_BACKENDS, the upstream kind and its servers (its directory then needs
    only the tokenizer: the gateway counts tokens, the upstream runs the weights), marked
    `(sleeps when idle)` where HYDRANT_UPSTREAM_SLEEP names it. A hub
    quantized checkpoint's format follows its architecture, e.g. `(gptq int4 g128)`.
    """
    from hydrant.platform.models.checkpoints import inspect_checkpoint

    settings = cli.settings()
    upstream = settings.upstream_pools()
    for spec in settings.served_models():
        backend = upstream.get(spec.name)
        info = inspect_checkpoint(spec.path)
        if backend is not None:
            has_tokenizer = (spec.path / "tokenizer.json").is_file()
            state = "ok" if has_tokenizer else "NOT SERVABLE: no tokenizer.json"
            served_by = f"{backend.kind}:{','.join(backend.urls)}"
            if backend.sleep:
                served_by += " (sleeps when idle)"
        else:
            state = "ok" if info.loadable else "NOT SERVABLE: " + "; ".join(info.problems)
            served_by = "hydrant"
        architecture = info.architecture or "-"
        if info.quantization is not None:
            architecture += f" ({info.quantization})"
        click.echo(f"{spec.name}\t{spec.path}\t{architecture}\t{state}\t{served_by}")


@models.command("quantize")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(file_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(["int8", "int4"]), required=True)
@click.option(
    "--format",
    "checkpoint_format",
    type=click.Choice(["hydrant", "compressed-tensors"]),
    default="hydrant",
    show_default=True,
    help="hydrant: the engine's own layout; compressed-tensors: pack-quantized with the "
    "Hugging Face names, for vLLM and transformers.",
)
def models_quantize(src: Path, dst: Path, mode: str, checkpoint_format: str) -> None:
    """Write a weight-only quantized copy of SRC to DST (loads without re-quantizing).

    The output head and embeddings stay in float. In the default format, serve
    DST like any checkpoint: the engine sees its manifest and loads the stored
    codes. With `--format compressed-tensors` DST holds the same codes the way
    llm-compressor writes them for vLLM and transformers (int8: per-channel
    symmetric; int4: groups of 128, asymmetric).
    """
    from hydrant.engine.quantized_weights import quantize_checkpoint

    # A ModelLoadError (not a checkpoint, an architecture not served) is a usage error (cli).
    report = quantize_checkpoint(
        src,
        dst,
        "int4" if mode == "int4" else "int8",
        lambda step: click.echo(step, err=True),
        "compressed-tensors" if checkpoint_format == "compressed-tensors" else "hydrant",
    )
    click.echo(
        f"quantized {len(report.quantized)} linear layers to {report.mode} "
        f"({len(report.skipped)} kept in float)"
    )
    click.echo(
        f"linear weight bytes: {report.bytes_before} -> {report.bytes_after} "
        f"({report.ratio_vs_float16:.2f}x of float16)"
    )
    click.echo(f"model bytes: {report.model_bytes_before} -> {report.model_bytes_after}")
    click.echo(str(dst))


@click.command("demo-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
def demo_model(directory: Path, seed: int) -> None:
    """Write the small demo checkpoint (HF layout, random weights: its output is noise)."""
    from hydrant.engine.demo_model import write_demo_model

    path = write_demo_model(directory, seed=seed, progress=lambda step: click.echo(step, err=True))
    click.echo(str(path))


@click.command()
@click.option(
    "--model", "model_ref", required=True, help="A checkpoint directory or a named shape."
)
@click.option("--memory-gib", type=float, default=80.0, show_default=True, help="Device memory.")
@click.option("--weight-dtype", help="Weight dtype (default: the checkpoint's).")
@click.option(
    "--kv-dtype", type=click.Choice(["float32", "float16", "bfloat16", "int8"]), help="KV dtype."
)
@click.option("--block-size", type=int, default=16, show_default=True)
@click.option("--gpu-memory-utilization", type=float, default=0.9, show_default=True)
@click.option("--prompt-tokens", type=int, default=512, show_default=True)
@click.option("--output-tokens", type=int, default=512, show_default=True)
@click.option(
    "--lengths-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Observed lengths instead: one 'PROMPT OUTPUT' pair per line.",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=256,
    show_default=True,
    help="The configured cap to check against what fits.",
)
@click.option(
    "--max-loras",
    type=int,
    default=8,
    show_default=True,
    help="LoRA adapter slots the engine keeps room for (HYDRANT_MAX_LORAS; 0: none).",
)
@click.option("--max-lora-rank", type=int, default=16, show_default=True)
def capacity(
    model_ref: str,
    memory_gib: float,
    weight_dtype: str | None,
    kv_dtype: str | None,
    block_size: int,
    gpu_memory_utilization: float,
    prompt_tokens: int,
    output_tokens: int,
    lengths_file: Path | None,
    max_num_seqs: int,
    max_loras: int,
    max_lora_rank: int,
) -> None:
    """How many sequences a device's KV cache really holds for a length distribution.

    Example (the field's trap): `hydrant capacity --model llama-3-8b --memory-gib 80
    --prompt-tokens 512 --output-tokens 1536` shows that a max_num_seqs of 256 cannot fit.
    """
    from hydrant.engine.capacity import (
        CapacityInputError,
        RequestLengths,
        format_report,
        plan_capacity,
    )
    from hydrant.engine.capacity_shapes import resolve_shape

    try:
        shape = resolve_shape(model_ref)
        if lengths_file is not None:
            pairs = []
            for line in lengths_file.read_text().splitlines():
                if line.strip():
                    prompt, output = line.split()[:2]
                    pairs.append((int(prompt), int(output)))
            lengths = RequestLengths.from_samples(pairs)
        else:
            lengths = RequestLengths.fixed(prompt_tokens, output_tokens)
        plan = plan_capacity(
            shape,
            device_memory_gib=memory_gib,
            requests=lengths,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            block_size=block_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_num_seqs=max_num_seqs,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
        )
    except (CapacityInputError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(format_report(plan))


@models.group("adapters")
def adapters() -> None:
    """LoRA adapters of a base model: register, list, remove (as /admin/models/{base}/adapters).

    Gateways see a change within HYDRANT_ADAPTER_REFRESH_S, without a restart."""


ADAPTER_COLUMNS = (
    "model", "tenant_id", "path", "hosting_fee_per_day", "price_model_id", "created_at"
)  # fmt: skip


@adapters.command("add")
@click.argument("base")
@click.argument("name")
@click.argument("path")
@click.option("--tenant", help="The owning tenant (id or name); without it, public.")
@click.option("--input-price", help="Its own price per million input tokens (a decimal).")
@click.option("--output-price", help="Per million output tokens (with --input-price).")
@click.option("--cached-input-price", help="Per million cached input tokens (default: input).")
@click.option("--hosting-fee-per-day", help="Charged to its tenant per UTC day (a decimal).")
@json_option
@pass_context
def adapters_add(
    cli: CliContext,
    base: str,
    name: str,
    path: str,
    tenant: str | None,
    input_price: str | None,
    output_price: str | None,
    cached_input_price: str | None,
    hosting_fee_per_day: str | None,
    as_json: bool,
) -> None:
    """Register the PEFT adapter at PATH as NAME on the model BASE (`BASE:NAME` in requests).

    Without prices it is charged the base model's price."""
    import msgspec

    from hydrant.platform.adapters.schemas import AdapterCreate, AdapterView
    from hydrant.platform.errors import Conflict
    from hydrant.platform.prices.schemas import DeploymentCreate

    if (input_price is None) != (output_price is None):
        raise click.UsageError("--input-price and --output-price go together")
    price = None
    if input_price is not None:
        price = {"input_per_mtok": input_price, "output_per_mtok": output_price}
        if cached_input_price is not None:
            price["cached_input_per_mtok"] = cached_input_price
    configured = {spec.name: spec for spec in cli.settings().served_models()}

    async def work(s: AdminServices) -> AdapterView:
        owner = (await s.tenants.find(s.principal, tenant)).id if tenant else None
        spec = configured.get(base)
        if spec is not None:  # a configured model no gateway has started yet: its row
            with contextlib.suppress(Conflict):  # refused before any write: it exists
                await s.prices.create_deployment(
                    DeploymentCreate(name=spec.name, path=str(spec.path))
                )
        fields: dict[str, object] = {"name": name, "path": path, "tenant_id": owner}
        fields |= {"price": price, "hosting_fee_per_day": hosting_fee_per_day}
        body = msgspec.convert(fields, AdapterCreate)
        return AdapterView.of(*await s.adapters.register(base, body))

    _emit([_run(cli, work)], ADAPTER_COLUMNS, as_json)


@adapters.command("list")
@click.argument("base")
@json_option
@pass_context
def adapters_list(cli: CliContext, base: str, as_json: bool) -> None:
    """The adapters registered on BASE."""
    from hydrant.platform.adapters.schemas import AdapterView

    async def work(s: AdminServices) -> list[AdapterView]:
        return [AdapterView.of(*row) for row in await s.adapters.list_of(base)]

    _emit(_run(cli, work), ADAPTER_COLUMNS, as_json)


@adapters.command("remove")
@click.argument("base")
@click.argument("name")
@pass_context
def adapters_remove(cli: CliContext, base: str, name: str) -> None:
    """Remove the adapter NAME of BASE: requests naming it get 404 (its price history stays)."""

    async def work(s: AdminServices) -> None:
        await s.adapters.remove(base, name)

    _run(cli, work)
    click.echo(f"removed {base}:{name}")
