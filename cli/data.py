"""``prunefx data shapes DIR``: write the deterministic synthetic detection dataset the YOLO pipeline defaults to."""

from pathlib import Path
from typing import Annotated

import typer

from prunefx.errors import PrunefxError


def shapes(
    out: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="Directory to create (reused if it holds the same dataset).", file_okay=False
        ),
    ],
    n_train: Annotated[int, typer.Option(min=1, help="Training images.")] = 384,
    n_val: Annotated[int, typer.Option(min=1, help="Validation images.")] = 96,
    imgsz: Annotated[int, typer.Option(min=32, help="Image side in pixels.")] = 128,
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Generate the synthetic shapes detection set in YOLO format and print the path of its data.yaml."""
    from prunefx.data.detection import make_shapes_dataset

    try:
        data = make_shapes_dataset(out, n_train=n_train, n_val=n_val, imgsz=imgsz, seed=seed)
    except ValueError as exc:
        raise PrunefxError(str(exc)) from exc
    typer.echo(data)
