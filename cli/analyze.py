"""``prunefx analyze SPEC``: print a model's groups of coupled channels; optionally save them as JSON or HTML."""

from pathlib import Path
from typing import Annotated

import typer

# Only light modules at the top (help texts included): each command imports torch and the library when it runs.
from prunefx._defaults import FORMS, INPUT_HELP, SIZES, TRUST_HELP
from prunefx.cli._console import new_console


def analyze(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help=f"Model: {FORMS}.")],
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", metavar="[NAME=]SHAPE[:DTYPE]|FILE|MOD:FN", help=INPUT_HELP)
    ] = None,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Also write the groups as JSON to this file.", dir_okay=False),
    ] = None,
    html_path: Annotated[
        Path | None,
        typer.Option("--html", help="Also write an interactive page of the graph and its groups to this file.",
                     dir_okay=False),
    ] = None,
    max_members: Annotated[int, typer.Option(min=1, help="Members listed per group in the table.")] = 6,
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Trace SPEC and print which channels must be pruned together, and which cannot be pruned and why."""
    import prunefx
    from prunefx._io import atomic_write
    from prunefx.spec import load_spec
    from prunefx.view import to_html

    loaded = load_spec(spec, imgsz=imgsz, trust_checkpoint=trust_checkpoint, inputs=inputs or ())
    dg = prunefx.analyze(loaded.model, loaded.example_inputs)
    console = new_console()
    console.print(dg.table(max_members=max_members))
    # Automatic leaves and ops without a rule explain most frozen groups, so they are named here.
    for name, why in dg.auto_leaves.items():
        console.out(f"traced as a leaf: {name} ({why})")
    for node, op in dg.unknown_ops.items():
        console.out(f"no rule, channels frozen: {node} = {op}")
    # out() neither wraps nor parses markup: the summary stays one line at any width, brackets and all.
    console.out(dg.summary())
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(json_path, dg.to_json().encode())
        console.out(f"wrote {json_path}")
    if html_path is not None:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(html_path, to_html(dg).encode())
        console.out(f"wrote {html_path}")
