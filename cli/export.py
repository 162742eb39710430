"""``prunefx export MODEL_OR_RUN --format onnx``: write an ONNX file, checked against the model with ONNX Runtime."""

import json
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
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    # Read by cli.main's error handler, which is the only code that needs it.
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Export MODEL_OR_RUN to ONNX, then run it with ONNX Runtime and check its outputs equal PyTorch's (1e-4).

    YOLO models go through ultralytics' own exporter; everything else through torch.onnx (TorchScript exporter),
    with eval BatchNorm folded into the convolutions first.
    """
    from prunefx.spec import load_spec

    path = Path(source)
    if path.is_dir():
        result = _export_run(path, out or path / "model.onnx", imgsz, opset, dynamic_batch, trust_checkpoint)
    else:
        loaded = load_spec(source, imgsz=imgsz, trust_checkpoint=trust_checkpoint)
        target = out or Path(loaded.name.replace(":", "_").replace("/", "_").removesuffix(".pt") + ".onnx")
        result = loaded.family.export_onnx(
            loaded.model, loaded.example_inputs, target, opset=opset, dynamic_batch=dynamic_batch
        )
    new_console().print(f"[green]wrote {result.describe()}[/green]", soft_wrap=True)


def _yolo(model, target: Path, imgsz: int, opset: int | None, dynamic: bool, trust: bool = False) -> "Exported":
    from prunefx.integrations.ultralytics.yolo_export import export_yolo

    return export_yolo(model, target, imgsz=imgsz, opset=opset, dynamic_batch=dynamic, trust_checkpoint=trust)


def _export_run(
    run: Path, target: Path, imgsz: int | None, opset: int | None, dynamic: bool, trust: bool
) -> "Exported":
    """Export the final model of a run directory: fine-tuned when there is one, else pruned."""
    import torch

    import prunefx
    from prunefx.onnx_export import export_onnx
    from prunefx.pipeline.classify_model import is_classifier_spec
    from prunefx.spec import load_spec

    yolo_best = run / "weights" / "best.pt"
    if yolo_best.is_file():  # a YOLO pipeline run: an ordinary ultralytics checkpoint
        return _yolo(yolo_best, target, imgsz or _config(run).get("imgsz", 640), opset, dynamic, trust)
    # A classification pipeline run: rebuilt through the run's own config (fine-tuning may have had 0 epochs)
    final = next((p for p in (run / "weights" / "finetuned.pt", run / "weights" / "pruned.pt") if p.is_file()), None)
    config = _config(run) if final is not None and (run / "config.yaml").is_file() else {}
    if final is not None and is_classifier_spec(config.get("model")):
        from prunefx.pipeline.backends.classify import ClassifyJob

        job = ClassifyJob.from_config(config)
        model = prunefx.load(final, job.factory()).eval()
        return export_onnx(model, (job.example(),), target, opset=opset or ONNX_OPSET, dynamic_batch=dynamic)
    pruned, report = run / "pruned.pt", run / "report.json"
    if pruned.is_file() and report.is_file():  # a `prunefx prune SPEC` run
        spec = json.loads(report.read_text()).get("settings", {}).get("spec")
        plan = json.loads((run / "plan.json").read_text())
        size = imgsz or plan["input_shapes"][0][-1]
        loaded = load_spec(spec, imgsz=size, trust_checkpoint=trust)
        model = loaded.family.load(pruned, lambda: loaded.model, trust_checkpoint=trust).eval()
        # The run's own inputs, unless --imgsz asks for another size (the SPEC was just built at it)
        x = loaded.example_inputs if imgsz is not None else tuple(
            torch.rand(s, generator=torch.Generator().manual_seed(0)) for s in plan["input_shapes"])
        return loaded.family.export_onnx(model, x, target, opset=opset, dynamic_batch=dynamic)
    raise PrunefxError(
        f"{run} is not a run directory prunefx can export: expected weights/best.pt (YOLO pipeline), "
        "weights/finetuned.pt or weights/pruned.pt with config.yaml (classification pipeline) or pruned.pt with "
        "report.json (prunefx prune SPEC)"
    )


def _config(run: Path) -> dict:
    from prunefx._config import load_yaml

    path = run / "config.yaml"
    if not path.is_file():
        raise PrunefxError(f"{run} has no config.yaml; pass the run directory a pipeline wrote")
    return load_yaml(path.read_text(), str(path)) or {}
