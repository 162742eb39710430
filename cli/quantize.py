"""``prunefx quantize MODEL_OR_RUN --out DIR``: post-training int8 with ONNX Runtime, checked against float."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

# Only light modules at the top (help texts included): the command imports torch and the library when it runs.
from prunefx._defaults import FORMS, SIZES, TRUST_HELP
from prunefx.cli._console import new_console
from prunefx.errors import PrunefxError

if TYPE_CHECKING:
    import torch


def quantize(
    source: Annotated[
        str,
        typer.Argument(metavar="MODEL_OR_RUN",
                       help=f"A run directory (of prunefx prune or a pipeline config) or a model: {FORMS}."),
    ],
    out: Annotated[Path, typer.Option(help="Directory for model.float.onnx and model.int8.onnx.", file_okay=False)],
    calib: Annotated[
        Path | None,
        typer.Option(help="A .pt file (read weights-only) of calibration inputs: one tensor of rows, split into "
                          "--batch rows each, or a list of batches. Default: random normal inputs.", dir_okay=False),
    ] = None,
    batches: Annotated[int, typer.Option(help="Random calibration batches (without --calib).", min=2)] = 8,
    batch: Annotated[int, typer.Option(help="Rows per calibration batch.", min=1)] = 4,
    method: Annotated[str, typer.Option(help="Calibration: auto (measured), minmax, entropy or percentile.")] = "auto",
    keep_float: Annotated[
        list[str] | None, typer.Option("--keep-float", help="Module/node name pattern kept float (repeatable).")
    ] = None,
    force_int8: Annotated[
        list[str] | None, typer.Option("--force-int8", help="Module/node name pattern forced int8 (repeatable).")
    ] = None,
    input_: Annotated[
        list[str] | None,
        typer.Option("--input", help="Example inputs instead of an image: 1x128:int64, a .pt file (repeatable)."),
    ] = None,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: the run's, else {SIZES}).")] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", metavar="SPEC", help="For a run of your own model code: its factory."),
    ] = None,
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Quantize MODEL_OR_RUN to int8 (ONNX Runtime static QDQ) and print the per-layer table and int8-vs-float error.

    The last quarter of the calibration batches is held out: the int8 model is compared with the float ONNX model
    there. Layers whose int8 error dominates stay float when that buys accuracy (--keep-float/--force-int8 decide).
    """
    from prunefx.deploy import quantize as run_quantize
    from prunefx.pipeline.readback import Given, read_final
    from prunefx.spec import load_spec

    path = Path(source)
    if path.is_dir():
        final = read_final(path, Given(model=model, imgsz=imgsz, trust_checkpoint=trust_checkpoint))
        net, example = final.model, final.example_inputs
    elif model is not None:
        raise PrunefxError(f"--model applies to a run directory; {source} is a model: quantize it alone")
    else:
        loaded = load_spec(source, imgsz=imgsz, trust_checkpoint=trust_checkpoint, inputs=tuple(input_ or ()))
        net, example = loaded.model, loaded.example_inputs
    from prunefx.metrics.common import as_args

    data = _from_file(calib, batch) if calib is not None else _random(as_args(example, net), batches, batch)
    result = run_quantize(net, example, data, out=out, method=method, keep_float=tuple(keep_float or ()),
                          force_int8=tuple(force_int8 or ()))
    console = new_console()
    console.print(result.table(), soft_wrap=True, highlight=False, markup=False)
    console.print(result.describe(), soft_wrap=True, highlight=False, markup=False)


def _tensors(example: Any) -> list["torch.Tensor"]:
    import torch
    from torch.utils._pytree import tree_flatten

    items = tuple(example) if isinstance(example, (tuple, list)) else (example,)
    return [t for t in tree_flatten(items)[0] if isinstance(t, torch.Tensor)]


def _random(example: Any, n: int, rows: int) -> list[tuple["torch.Tensor", ...]]:
    """``n`` batches of ``rows`` random inputs shaped like the example's (normal floats, integers copied)."""
    import torch

    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        batch = []
        for t in _tensors(example):
            shape = (rows, *t.shape[1:]) if t.dim() else t.shape
            batch.append(torch.randn(shape, generator=g) if t.is_floating_point()
                         else t[:1].expand(shape).clone() if t.dim() else t)
        out.append(tuple(batch))
    return out


def _from_file(path: Path, rows: int) -> list[Any]:
    """Calibration batches from a tensor file (weights-only): one tensor split by rows, or a list of batches."""
    import torch

    from prunefx._io import load_torch_file

    try:
        data = load_torch_file(path)
    except FileNotFoundError:
        raise PrunefxError(f"--calib {path} does not exist; give a .pt file saved with torch.save") from None
    if isinstance(data, torch.Tensor):
        return list(data.split(rows))
    if isinstance(data, (list, tuple)):
        return list(data)
    raise PrunefxError(f"--calib {path} holds a {type(data).__name__}; save one tensor of rows or a list of batches")
