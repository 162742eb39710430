"""``prunefx prune SPEC``: analyze -> score -> plan -> rewrite -> verify -> save -> report, in one run directory."""

import shutil
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

import prunefx
from prunefx._io import atomic_write
from prunefx.analysis.view import graph_data
from prunefx.errors import PrunefxError
from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
from prunefx.metrics import latency as measure_latency
from prunefx.metrics import measure
from prunefx.pipeline import is_config, run_config
from prunefx.report import Stage, build_report, load_report, render_table, write_graph, write_report
from prunefx.spec import FORMS, SIZES, load_spec


class Scope(str, Enum):
    """How the target is spread over groups."""

    global_ = "global"  # one score threshold over every group (network slimming)
    local = "local"  # every group loses the same fraction


def prune(
    ctx: typer.Context,
    spec: Annotated[
        str, typer.Argument(metavar="CONFIG|SPEC", help=f"A pipeline config (configs/yolo.yaml) or a model: {FORMS}.")
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[KEY=VALUE]...", help="Config overrides, e.g. epochs=3 prune.target.flops=0.4.", show_default=False
        ),
    ] = None,
    flops: Annotated[float | None, typer.Option(help="Keep this fraction of the MACs/FLOPs, in (0, 1].")] = None,
    ratio: Annotated[
        float | None, typer.Option(help="Remove this fraction of the prunable channels, in [0, 1).")
    ] = None,
    params: Annotated[float | None, typer.Option(help="Keep this fraction of the parameters, in (0, 1].")] = None,
    criterion: Annotated[str, typer.Option(help="Channel importance: bn_scale, l1, l2, taylor, random.")] = "bn_scale",
    scope: Annotated[Scope, typer.Option(help="global threshold or per-layer (local) ratio.")] = Scope.global_,
    round_to: Annotated[int, typer.Option(min=1, help="Round kept widths up to a multiple of this.")] = 1,
    ignore: Annotated[
        list[str] | None, typer.Option(help="fnmatch pattern of modules to leave alone (repeatable).")
    ] = None,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    out: Annotated[
        Path | None, typer.Option(help="Run directory (default: runs/prune/<model>).", file_okay=False)
    ] = None,
    exist_ok: Annotated[bool, typer.Option(help="Replace an existing run directory.")] = False,
    latency: Annotated[bool, typer.Option(help="Also measure CPU latency before and after.")] = True,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Run a pipeline config (train, sparsity, prune, fine-tune, report), or prune SPEC once and write a report.

    With a config (e.g. configs/yolo.yaml) every setting is a config key, overridable as key=value; with a model
    SPEC the options below apply and nothing is trained.
    """
    if is_config(spec):
        # An option whose value differs from its default was given: it has no meaning for a config.
        given = [
            p.name
            for p in ctx.command.params
            if p.name not in ("spec", "overrides", "verbose") and _plain(ctx.params.get(p.name)) != _plain(p.default)
        ]
        if given:
            raise PrunefxError(
                f"--{given[0].replace('_', '-')} applies to a model SPEC; with a config write it as "
                "key=value (e.g. prune.target.flops=0.5 prune.round_to=8)"
            )
        console = Console()
        run = run_config(spec, overrides or (), log=console.print)
        console.print(render_table(load_report(run.root)))
        console.print(f"[green]report: {run.root / 'report.md'}[/green] (weights: {run.root / 'weights'})")
        return
    if overrides:
        raise PrunefxError(
            f"{spec} is not a pipeline config, so key=value overrides ({overrides[0]}) do not apply; "
            "give a config yaml (configs/yolo.yaml) or use the options (--flops 0.5)"
        )
    if flops is None and ratio is None and params is None:
        flops = 0.5  # the common ask: half the compute
    config = prunefx.PlanConfig(
        ratio=ratio, flops=flops, params=params, scope=scope.value, round_to=round_to, ignore=tuple(ignore or ())
    )
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
    widths = [(result.graph.groups[g.group].label, g.before, g.after) for g in result.plan.groups]
    report = build_report(
        model=loaded.name,
        baseline=baseline,
        pruned=pruned,
        widths=widths,
        settings={
            "spec": spec,
            "criterion": criterion,
            "target": result.plan.target,
            "verify": result.verified.message,
            "input_shapes": [list(s) for s in result.plan.input_shapes],
        },
    )

    # Build the run in a sibling temp dir and move it into place: a half-written run never looks finished.
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix=f".{run_dir.name}."))
    try:
        atomic_write(tmp / "plan.json", result.plan.to_json().encode())
        write_graph(tmp, graph_data(result.graph, result.plan))  # report.html draws the graph from it
        if is_yolo:
            from prunefx.integrations.ultralytics.io import save_yolo

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
    console.print(f"[green]verify: {result.verified.message}[/green]")  # prune() raises rather than fail it
    for gid, reason in result.frozen_by_check:
        console.print(f"[yellow]frozen by the check: group {gid} ({result.graph.groups[gid].label}): {reason}[/yellow]")
    console.print(f"run directory: {run_dir} (report.md, report.html, report.json, plan.json, pruned.pt)")


def _plain(value: object) -> object:
    """An option value comparable with its declared default (enums by value, empty lists as None)."""
    if isinstance(value, Enum):
        return value.value
    return None if value in ((), []) else value
