"""``prunefx data shapes DIR``: write the deterministic synthetic detection dataset the YOLO pipeline defaults to."""

from pathlib import Path
from typing import Annotated

import typer

from prunefx.errors import PrunefxError


# Option help is rich markup: a backslash before "[" keeps "[default: ...]" from being read as a tag and dropped.
def shapes(
    out: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="Directory to create (reused if it holds the same dataset).", file_okay=False
        ),
    ],
    n_train: Annotated[int | None, typer.Option(min=1, help="Training images \\[default: 384; --hard 1200].")] = None,
    n_val: Annotated[int | None, typer.Option(min=1, help="Validation images \\[default: 96; --hard 300].")] = None,
    imgsz: Annotated[int | None, typer.Option(min=32, help="Image side in px \\[default: 128; --hard 160].")] = None,
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    hard: Annotated[bool, typer.Option("--hard", help="The hard set: 20 classes, small, occluded objects, clutter "
                                        "and decoys (defaults: 1200 train, 300 val, 160 px).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Generate the synthetic shapes detection set in YOLO format and print the path of its data.yaml."""
    from prunefx._extras import require

    require("cv2", "the synthetic detection set")
    from prunefx.data.detection import make_shapes_dataset
    from prunefx.data.detection_hard import make_hard_shapes_dataset

    given = {k: v for k, v in (("n_train", n_train), ("n_val", n_val), ("imgsz", imgsz)) if v is not None}
    try:
        if hard:
            data = make_hard_shapes_dataset(out, seed=seed, **given)
        else:
            data = make_shapes_dataset(out, **{"n_train": 384, "n_val": 96, "imgsz": 128, **given}, seed=seed)
    except ValueError as exc:
        raise PrunefxError(str(exc)) from exc
    typer.echo(data)
