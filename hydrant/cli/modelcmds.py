"""Model commands: list what is served, generate the demo model, size the KV cache."""

from __future__ import annotations

from pathlib import Path

import click

from hydrant.cli.context import CliContext, not_yet, pass_context


@click.group()
def models() -> None:
    """Models the gateway serves; quantize checkpoints."""


@models.command("list")
@pass_context
def models_list(cli: CliContext) -> None:
    """List configured models and whether each checkpoint can be served."""
    from hydrant.platform.models.checkpoints import inspect_checkpoint

    for spec in cli.settings().served_models():
        info = inspect_checkpoint(spec.path)
        state = "ok" if info.loadable else "NOT SERVABLE: " + "; ".join(info.problems)
        click.echo(f"{spec.name}\t{spec.path}\t{info.architecture or '-'}\t{state}")


@models.command("quantize")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(file_okay=False, path_type=Path))
@click.option("--mode", type=click.Choice(["int8", "int4"]), required=True)
def models_quantize(src: Path, dst: Path, mode: str) -> None:
    """Write a weight-only quantized copy of SRC to DST (loads without re-quantizing)."""
    not_yet("offline quantization", 5)


@click.command("demo-model")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", type=int, default=0, show_default=True)
def demo_model(directory: Path, seed: int) -> None:
    """Write the small demo checkpoint (HF layout, random weights: its output is noise)."""
    from hydrant.engine.demo_model import write_demo_model

    path = write_demo_model(directory, seed=seed, progress=lambda step: click.echo(step, err=True))
    click.echo(str(path))


@click.command()
@click.option("--model", "model_ref", required=True, help="Checkpoint dir or a named shape.")
def capacity(model_ref: str) -> None:
    """How many sequences a device's KV cache really holds for a length distribution."""
    not_yet("the capacity calculator", 3)
