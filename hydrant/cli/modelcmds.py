"""Model commands: list what is served, generate the demo model, size the KV cache."""

from __future__ import annotations

from pathlib import Path

import click

from hydrant.cli.context import CliContext, pass_context


@click.group()
def models() -> None:
    """Models the gateway serves; quantize checkpoints."""


@models.command("list")
@pass_context
def models_list(cli: CliContext) -> None:
    """List configured models, whether each checkpoint can be served, and what serves it.

    The last column is the pool's kind: `hydrant` (Hydrant's engines) or, for a model in
    HYDRANT_POOL_BACKENDS, the upstream kind and its servers (its directory then needs
    only the tokenizer: the gateway counts tokens, the upstream runs the weights).
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
        else:
            state = "ok" if info.loadable else "NOT SERVABLE: " + "; ".join(info.problems)
            served_by = "hydrant"
        architecture = info.architecture or "-"
        click.echo(f"{spec.name}\t{spec.path}\t{architecture}\t{state}\t{served_by}")


@models.command("quantize")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(file_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(["int8", "int4"]), required=True)
def models_quantize(src: Path, dst: Path, mode: str) -> None:
    """Write a weight-only quantized copy of SRC to DST (loads without re-quantizing).

    Serve DST like any checkpoint: the engine sees its manifest and loads the
    stored codes. The output head and embeddings stay in float.
    """
    from hydrant.engine.quantized_weights import quantize_checkpoint

    # A ModelLoadError (not a checkpoint, an architecture not served) is a usage error (cli).
    report = quantize_checkpoint(
        src, dst, "int4" if mode == "int4" else "int8", lambda step: click.echo(step, err=True)
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
        )
    except (CapacityInputError, ValueError) as exc:
        raise click.UsageError(str(exc)) from exc
    click.echo(format_report(plan))
