"""``prunefx prune SPEC``: analyze -> score -> plan -> rewrite -> verify -> save -> report, in one run directory."""

import shutil
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

import prunefx
from prunefx.errors import PrunefxError
from prunefx.fileio import atomic_write
from prunefx.metrics import latency as measure_latency
from prunefx.metrics import measure, ultralytics_gflops
from prunefx.models import FORMS, SIZES, load_spec
from prunefx.report import Stage, build_report, render_table, write_report


class Scope(str, Enum):
    """How the target is spread over groups."""

    global_ = "global"  # one score threshold over every group (network slimming)
    local = "local"  # every group loses the same fraction


def prune(
    spec: Annotated[str, typer.Argument(metavar="SPEC", help=f"Model: {FORMS}.")],
    flops: Annotated[float | None, typer.Option(help="Keep this fraction of the MACs/FLOPs, in (0, 1].")] = None,
    ratio: Annotated[float | None, typer.Option(help="Remove this fraction of the prunable channels, in [0, 1).")] = None,
    params: Annotated[float | None, typer.Option(help="Keep this fraction of the parameters, in (0, 1].")] = None,
    criterion: Annotated[str, typer.Option(help="Channel importance: bn_scale, l1, l2, taylor, random.")] = "bn_scale",
    scope: Annotated[Scope, typer.Option(help="global threshold or per-layer (local) ratio.")] = Scope.global_,
    round_to: Annotated[int, typer.Option(min=1, help="Round kept widths up to a multiple of this.")] = 1,
    ignore: Annotated[list[str] | None, typer.Option(help="fnmatch pattern of modules to leave alone (repeatable).")] = None,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/prune/<model>).", file_okay=False)] = None,
    exist_ok: Annotated[bool, typer.Option(help="Replace an existing run directory.")] = False,
    latency: Annotated[bool, typer.Option(help="Also measure CPU latency before and after.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Prune SPEC to a FLOPs / params / channel target, check it against the masked original and write a report."""
    if flops is None and ratio is None and params is None:
        flops = 0.5  # the common ask: half the compute
    config = prunefx.PlanConfig(ratio=ratio, flops=flops, params=params, scope=scope.value, round_to=round_to,
                                ignore=tuple(ignore or ()))
    loaded = load_spec(spec, imgsz=imgsz)
    run_dir = out or Path("runs/prune") / loaded.name.replace(":", "_").replace("/", "_")
    if run_dir.exists() and any(run_dir.iterdir()) and not exist_ok:
        raise PrunefxError(f"{run_dir} already holds a run; pick another --out or pass --exist-ok to replace it")
    console = Console()
    model, inputs = loaded.model, loaded.example_inputs
    is_yolo = loaded.kind in ("ultralytics", "checkpoint")

    def stage() -> Stage:
        extra = {"ultralytics_gflops": ultralytics_gflops(model, tuple(inputs[0].shape[-2:]))} if is_yolo else {}
        return Stage(measure(model, inputs), measure_latency(model, inputs) if latency else None, extra)

    with console.status("measuring the baseline"):
        baseline = stage()
    with console.status("analyzing, scoring, planning, rewriting, verifying"):
        result = prunefx.prune(model, inputs, config, criterion=criterion)
    with console.status("measuring the pruned model"):
        pruned = stage()
    widths = [(_group_name(result.graph.groups[g.group]), g.before, g.after) for g in result.plan.groups]
    report = build_report(model=loaded.name, baseline=baseline, pruned=pruned, widths=widths,
                          settings={"spec": spec, "criterion": criterion, "target": result.plan.target,
                                    "verify": result.verified.message, "input_shapes": [list(s) for s in result.plan.input_shapes]})

    # Build the run in a sibling temp dir and move it into place: a half-written run never looks finished.
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}."))
    try:
        atomic_write(tmp / "plan.json", result.plan.to_json().encode())
        if is_yolo:
            from prunefx.integrations.ultralytics_io import save_yolo

            save_yolo(model, tmp / "pruned.pt", plan=result.plan)
        else:
            prunefx.save(model, result.plan, tmp / "pruned.pt")
        write_report(tmp, report)
        if run_dir.exists():
            shutil.rmtree(run_dir)
        tmp.rename(run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    console.print(render_table(report))
    console.print(result.plan.summary())
    style = "green" if result.verified.ok else "bold red"
    console.print(f"[{style}]verify: {result.verified.message}[/{style}]")
    console.print(f"run directory: {run_dir} (report.md, report.json, plan.json, pruned.pt)")
    if not result.verified.ok:
        raise typer.Exit(1)


def _group_name(group: "prunefx.Group") -> str:
    outs = group.modules("out") or group.modules()
    return outs[0] if outs else f"group {group.id}"
