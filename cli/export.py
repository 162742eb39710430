"""``prunefx export MODEL_OR_RUN --format onnx``: write an ONNX file, checked against the model with ONNX Runtime."""

from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top (help texts included): each command imports torch and the library when it runs.
from prunefx._defaults import FORMS, ONNX_OPSET, SIZES, TRUST_HELP
from prunefx.cli._console import new_console
from prunefx.errors import PrunefxError

if TYPE_CHECKING:
    from prunefx.onnx_export import Exported
    from prunefx.pipeline.readback import Given


class Format(str, Enum):
    """Export formats."""

    onnx = "onnx"


def export(
    source: Annotated[
        str,
        typer.Argument(
            metavar="MODEL_OR_RUN",
            help=f"A run directory (of prunefx prune or a pipeline config) or a model: {FORMS}.",
        ),
    ],
    format_: Annotated[Format, typer.Option("--format", help="What to write.")] = Format.onnx,
    out: Annotated[
        Path | None,
        typer.Option(help="File to write (default: RUN/model.onnx, or <model>.onnx here).", dir_okay=False),
    ] = None,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: the run's, else {SIZES}).")] = None,
    opset: Annotated[
        int | None, typer.Option(help=f"ONNX opset (default: {ONNX_OPSET}; ultralytics' choice for YOLO).")
    ] = None,
    dynamic_batch: Annotated[
        bool, typer.Option(help="Make the batch dimension dynamic (checked at two sizes).")
    ] = False,
    model: Annotated[
        str | None,
        typer.Option("--model", metavar="SPEC", help="For a run of your own model code (package.module:function in "
                                                     "its config, never imported from the run): that factory."),
    ] = None,
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Export MODEL_OR_RUN to ONNX, then run it with ONNX Runtime and check its outputs equal PyTorch's (to round-off).

    YOLO models go through ultralytics' own exporter; everything else through torch.onnx (TorchScript exporter),
    with eval BatchNorm folded into the convolutions first. A run is read back by the pipeline that wrote it (its
    fine-tuned model, else its pruned one), weights-only; code a run names is never imported: give --model.
    """
    from prunefx.pipeline.readback import Given
    from prunefx.spec import load_spec

    path = Path(source)
    if path.is_dir():
        given = Given(model=model, imgsz=imgsz, trust_checkpoint=trust_checkpoint)
        result = _export_run(path, out or path / "model.onnx", given, opset, dynamic_batch)
    elif model is not None:
        raise PrunefxError(f"--model applies to a run directory; {source} is a model: export it alone")
    else:
        loaded = load_spec(source, imgsz=imgsz, trust_checkpoint=trust_checkpoint)
        target = out or Path(loaded.name.replace(":", "_").replace("/", "_").removesuffix(".pt") + ".onnx")
        result = loaded.family.export_onnx(
            loaded.model, loaded.example_inputs, target, opset=opset, dynamic_batch=dynamic_batch
        )
    new_console().print(f"[green]wrote {result.describe()}[/green]", soft_wrap=True)


def _export_run(run: Path, target: Path, given: "Given", opset: int | None, dynamic: bool) -> "Exported":
    """Export the final model of a finished run, read back by the pipeline that wrote it (nothing in it executes)."""
    from prunefx.pipeline.readback import read_final

    final = read_final(run, given)
    return final.family.export_onnx(final.model, final.example_inputs, target, opset=opset, dynamic_batch=dynamic)
