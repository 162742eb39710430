"""``prunefx prune SPEC``: analyze -> score -> plan -> rewrite -> verify -> save -> report, in one run directory."""

import copy
import datetime
import json
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.console import Console

import prunefx
from prunefx._io import atomic_write
from prunefx.analysis.view import graph_data
from prunefx.cli.flops import Backend
from prunefx.errors import PrunefxError
from prunefx.integrations.ultralytics.gflops import ultralytics_gflops
from prunefx.metrics import Deployment, compare_latency, measure
from prunefx.pipeline import run_config
from prunefx.pipeline.rundir import SCHEMA, STATE, check_replaceable, install, is_run
from prunefx.report import Stage, build_report, load_report, render_table, write_graph, write_report
from prunefx.spec import FORMS, SIZES, TRUST_HELP, LoadedModel, load_spec

CONFIG_SUFFIXES = (".yaml", ".yml")


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
    flops: Annotated[float | None, typer.Option(help="Keep this fraction of the MACs/FLOPs, in (0, 1).")] = None,
    ratio: Annotated[
        float | None, typer.Option(help="Remove this fraction of the prunable channels, in (0, 1).")
    ] = None,
    params: Annotated[float | None, typer.Option(help="Keep this fraction of the parameters, in (0, 1).")] = None,
    latency_target: Annotated[
        float | None,
        typer.Option(help="Keep this fraction of the latency measured on --backend/--device/--threads, in (0, 1)."),
    ] = None,
    criterion: Annotated[str, typer.Option(help="Channel importance: bn_scale, l1, l2, taylor, random.")] = "bn_scale",
    scope: Annotated[Scope, typer.Option(help="global threshold or per-layer (local) ratio.")] = Scope.global_,
    round_to: Annotated[
        str,
        typer.Option(
            metavar="N|auto",
            help="Round kept widths up to a multiple of N, or 'auto': to the fast edge of each measured latency step.",
        ),
    ] = "1",
    ignore: Annotated[
        list[str] | None, typer.Option(help="fnmatch pattern of modules to leave alone (repeatable).")
    ] = None,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory (default: runs/prune/<model>).")] = None,
    exist_ok: Annotated[bool, typer.Option(help="Replace an existing run directory (only a prunefx run).")] = False,
    latency: Annotated[
        bool, typer.Option(help="Also time the baseline and the pruned model (alternating rounds) for the report.")
    ] = True,
    backend: Annotated[Backend, typer.Option(help="What runs timed forwards (report and latency target).")] = (
        Backend.torch
    ),
    device: Annotated[str, typer.Option(help="Where forwards are timed: cpu, cuda, cuda:N.")] = "cpu",
    threads: Annotated[int | None, typer.Option(min=1, help="Threads while timing (default: torch's).")] = None,
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Run a pipeline config (train, sparsity, prune, fine-tune, report), or prune SPEC once and write a report.

    With a config (e.g. configs/yolo.yaml) every setting is a config key, overridable as key=value; with a model
    SPEC the options below apply and nothing is trained.
    """
    if is_config_argument(spec):
        _run_pipeline(ctx, spec, list(overrides or ()), trust_checkpoint)
        return
    if overrides:
        raise PrunefxError(
            f"{spec} is not a pipeline config, so key=value overrides ({overrides[0]}) do not apply; "
            "give a config yaml (configs/yolo.yaml) or use the options (--flops 0.5)"
        )
    if flops is None and ratio is None and params is None and latency_target is None:
        flops = 0.5  # the common ask: half the compute
    rounding = _round_to(round_to)
    config = prunefx.PlanConfig(
        ratio=ratio, flops=flops, params=params, latency=latency_target, scope=scope.value, round_to=rounding,
        ignore=tuple(ignore or ()),
    )
    keeps_all = [f"--{k} {v}" for k, v, full in (("flops", flops, 1.0), ("params", params, 1.0), ("ratio", ratio, 0.0),
                                                  ("latency-target", latency_target, 1.0)) if v == full]
    if keeps_all:  # the planner accepts these targets; a one-shot prune with them would write an unpruned model
        raise PrunefxError(f"{keeps_all[0]} keeps every channel, so there is nothing to prune; give a target that "
                           "removes some (e.g. --flops 0.5 or --ratio 0.3)")
    run_dir = out or Path("runs/prune") / spec.strip().replace(":", "_").replace("/", "_").replace("\\", "_")
    _check_out(run_dir, exist_ok)  # before any work: refusing later would waste it
    deployment = Deployment(backend=backend.value, device=device, threads=threads)
    if latency or latency_target is not None or rounding == "auto":
        deployment.resolve()  # a missing GPU or onnxruntime fails now, before any work
    loaded = load_spec(spec, imgsz=imgsz, trust_checkpoint=trust_checkpoint)
    _check_train_mode(loaded)
    _prune_once(loaded, spec, config, criterion, run_dir, latency, deployment)


def is_config_argument(arg: str) -> bool:
    """Whether ``prune``'s argument names a pipeline config (any .yaml/.yml path), not a model SPEC.

    Decided by what the argument is, so a missing, empty or broken config gets the config loader's message. An
    ultralytics *model* yaml given here is neither: a model is named ``ultralytics:PATH``.
    """
    if not arg.lower().endswith(CONFIG_SUFFIXES) or arg.startswith("ultralytics:"):
        return False
    path = Path(arg)
    if path.is_file():
        import yaml

        try:
            data = yaml.safe_load(path.read_text())
        except UnicodeDecodeError as exc:  # the config loader reads text and would not say this
            raise PrunefxError(f"config {arg} is not a text (UTF-8 YAML) file: {exc}; give a YAML config such as "
                               "configs/yolo.yaml") from exc
        except yaml.YAMLError:
            return True  # the config loader says what is wrong
        if isinstance(data, dict) and "backbone" in data and "head" in data and "model" not in data:
            raise PrunefxError(
                f"{arg} is an ultralytics model yaml, not a pipeline config; prune the model once with "
                f"`prunefx prune ultralytics:{arg}`, or train and prune it with a config whose model: is {arg}"
            )
    return True


def _run_pipeline(ctx: typer.Context, path: str, overrides: list[str], trust_checkpoint: bool) -> None:
    # An option whose value differs from its default was given: it has no meaning for a config.
    given = [
        p.name
        for p in ctx.command.params
        if p.name not in ("spec", "overrides", "verbose", "trust_checkpoint")
        and _plain(ctx.params.get(p.name)) != _plain(p.default)
    ]
    if given:
        raise PrunefxError(
            f"--{given[0].replace('_', '-')} applies to a model SPEC; with a config write it as "
            "key=value (e.g. prune.target.flops=0.5 prune.round_to=8)"
        )
    if trust_checkpoint:
        overrides = [*overrides, "trust_checkpoint=true"]
    console = Console()
    run = run_config(path, overrides, log=console.print)
    console.print(render_table(load_report(run.root)))
    console.print(f"[green]report: {run.root / 'report.md'}[/green] (weights: {run.root / 'weights'})")


def _check_out(run_dir: Path, exist_ok: bool) -> None:
    """The run directory can be written: missing or empty, or (with --exist-ok) a prunefx run to replace."""
    check_replaceable(run_dir)  # a file, or a directory that is not a run, is never replaced
    if run_dir.is_dir() and any(run_dir.iterdir()) and not exist_ok:
        what = "holds a run" if is_run(run_dir) else "is not empty"
        raise PrunefxError(f"{run_dir} already {what}; pick another --out or pass --exist-ok to replace it")


def _check_train_mode(loaded: LoadedModel) -> None:
    """The original must run in train mode on the example input: the oracle checks the pruned model in both modes."""
    probe = copy.deepcopy(loaded.model).train()  # a copy: train-mode forwards update BatchNorm statistics
    try:
        with torch.no_grad():
            probe(*loaded.example_inputs)
    except Exception as exc:  # any failure means the check cannot run here
        shape = "x".join(map(str, loaded.example_inputs[0].shape))
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise PrunefxError(
            f"{loaded.name} cannot run in train mode on one {shape} input ({type(exc).__name__}: {detail}); the "
            "pruned model is verified in eval and train mode, so give a larger --imgsz"
        ) from exc


def _prune_once(
    loaded: LoadedModel,
    spec: str,
    config: prunefx.PlanConfig,
    criterion: str,
    run_dir: Path,
    latency: bool,
    deployment: Deployment,
) -> None:
    console = Console()
    model, inputs = loaded.model, loaded.example_inputs
    is_yolo = loaded.kind in ("ultralytics", "checkpoint")

    def costs() -> tuple:
        extra = {"ultralytics_gflops": ultralytics_gflops(model, tuple(inputs[0].shape[-2:]))} if is_yolo else {}
        return measure(model, inputs), extra

    with console.status("measuring the baseline"):
        base_costs = costs()
        original = copy.deepcopy(model) if latency else None  # timed next to the pruned model, in alternating rounds
    status = "measuring latencies, planning against them, " if config.latency is not None else "analyzing, scoring, "
    with console.status(status + "planning, rewriting, verifying"):
        result = prunefx.prune(model, inputs, config, criterion=criterion, deployment=deployment)
    if not result.plan.pruned:
        raise _nothing_pruned(result, spec, config)
    with console.status("measuring the pruned model"):
        pruned_costs = costs()
        timed = compare_latency({"baseline": original, "pruned": model}, inputs, deployment) if latency else {}
    baseline = Stage(base_costs[0], timed.get("baseline"), base_costs[1])
    pruned = Stage(pruned_costs[0], timed.get("pruned"), pruned_costs[1])
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
            **({"latency_target": {"note": result.latency.note, "rounds": [asdict(r) for r in result.latency.rounds]}}
               if result.latency else {}),
        },
    )
    # state.json marks the directory as a prunefx run (what --exist-ok may replace); complete only if verified.
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    state = {
        "schema": SCHEMA,
        "kind": "prune",
        "status": "complete" if result.verified.ok else "failed",
        "created": now,
        "finished": now,
        "stages": {"prune": {"spec": spec, "verify": result.verified.message}},
        "error": None if result.verified.ok else {"stage": "prune", "type": "VerifyFailed",
                                                  "message": result.verified.message},
    }

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
        atomic_write(tmp / STATE, json.dumps(state, indent=2).encode())
        install(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    console.print(render_table(report))
    console.print(result.plan.summary())
    if result.latency is not None:
        console.print(f"latency target: {result.latency.note}", style="green" if result.latency.met else "yellow")
    console.print(f"[green]verify: {result.verified.message}[/green]")  # prune() raises rather than fail it
    for gid, reason in result.frozen_by_check:
        console.print(f"[yellow]frozen by the check: group {gid} ({result.graph.groups[gid].label}): {reason}[/yellow]")
    console.print(f"run directory: {run_dir} (report.md, report.html, report.json, plan.json, pruned.pt)")


def _round_to(text: str) -> int | str:
    """--round-to's value: 'auto' or a positive integer."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise typer.BadParameter(f"expected a positive integer or 'auto', got {text!r}", param_hint="--round-to")
    return value


def _nothing_pruned(result: prunefx.PruneResult, spec: str, config: prunefx.PlanConfig) -> PrunefxError:
    """Why a plan removes no channel: nothing is prunable, every prunable group was left out, or the target is met."""
    groups = result.graph.groups
    prunable = [g for g in groups if g.prunable]
    if not prunable:
        reasons = Counter(r for g in groups for r in g.reasons)
        top = "; ".join(f"{r} ({n})" for r, n in reasons.most_common(3)) or "no channel groups"
        return PrunefxError(f"nothing in {spec} can be pruned: all {len(groups)} channel groups are frozen ({top}); "
                            f"`prunefx analyze {spec}` lists them")
    skipped = dict(result.plan.skipped)
    if all(g.id in skipped for g in prunable):
        reasons = Counter(skipped[g.id] for g in prunable)
        top = "; ".join(f"{r} ({n})" for r, n in reasons.most_common(3))
        return PrunefxError(f"none of the {len(prunable)} prunable groups of {spec} may be pruned: {top}; "
                            "narrow --ignore or change the settings that exclude them")
    target = ", ".join(
        f"{k} {v}" for k, v in result.plan.target.items() if k in ("ratio", "flops", "params", "latency")
    )
    return PrunefxError(f"the target ({target or config}) is already met: the plan removes no channel from {spec}; "
                        "lower it (e.g. --flops 0.5 or --ratio 0.3)")


def _plain(value: object) -> object:
    """An option value comparable with its declared default (enums by value, empty lists as None)."""
    if isinstance(value, Enum):
        return value.value
    return None if value in ((), []) else value
