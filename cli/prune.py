"""``prunefx prune SPEC``: analyze -> score -> plan -> rewrite -> verify -> save -> report, in one run directory."""

import copy
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

# Only light modules at the top (help texts included): each command imports torch and the library when it runs.
from prunefx._defaults import FORMS, INPUT_HELP, SIZES, TRUST_HELP
from prunefx.cli._console import new_console
from prunefx.cli.flops import Backend
from prunefx.errors import PrunefxError

if TYPE_CHECKING:
    from prunefx.metrics import Deployment
    from prunefx.plan import PlanConfig
    from prunefx.spec import LoadedModel

CONFIG_SUFFIXES = (".yaml", ".yml")


class Normalize(str, Enum):
    """How each group's scores are scaled before one global ranking: PlanConfig.normalize's values (a test checks)."""

    none = "none"
    mean = "mean"
    max = "max"
    sum = "sum"
    standard = "standard"


class Scope(str, Enum):
    """How the target is spread over groups."""

    global_ = "global"  # one score threshold over every group (network slimming)
    local = "local"  # every group loses the same fraction
    sensitivity = "sensitivity"  # widths of least measured damage (each group's cut measured on calibration data)


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
    scope: Annotated[
        Scope,
        typer.Option(help="global threshold, per-layer (local) ratio, or sensitivity: each group's width from its "
                          "measured output damage (a SPEC comes with no data: measured on its one example input).")
    ] = Scope.global_,
    normalize: Annotated[
        Normalize,
        typer.Option(help="Scale each group's scores before the global ranking: by its mean, max or sum of |score|, "
                          "or standardised; none ranks raw scores."),
    ] = Normalize.none,
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
    steps: Annotated[
        int, typer.Option(min=1, help="Reach the target in this many cuts, re-scoring the model between them.")
    ] = 1,
    imgsz: Annotated[int | None, typer.Option(help=f"Input image size (default: {SIZES}).")] = None,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", metavar="[NAME=]SHAPE[:DTYPE]|FILE|MOD:FN", help=INPUT_HELP)
    ] = None,
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
    refit: Annotated[
        bool,
        typer.Option("--refit", help="After the cut, re-fit each layer that lost input channels by least squares to "
                                     "the original's outputs. A SPEC comes with no data: the calibration is its one "
                                     "example input (--imgsz), and the report says so (prune.refit in a config: "
                                     "8 batches of its training data; prunefx.prune(calibration=...) re-fits by "
                                     "default)."),
    ] = False,
    trust_checkpoint: Annotated[bool, typer.Option("--trust-checkpoint", help=TRUST_HELP)] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="On error, also print the traceback.")] = False,
) -> None:
    """Run a pipeline config (train, sparsity, prune, fine-tune, report), or prune SPEC once and write a report.

    With a config (e.g. configs/yolo.yaml) every setting is a config key, overridable as key=value; with a model
    SPEC the options below apply and nothing is trained.
    """
    import prunefx
    from prunefx.metrics import Deployment
    from prunefx.spec import load_spec

    if is_config_argument(spec):
        _run_pipeline(ctx, spec, list(overrides or ()), trust_checkpoint)
        return
    if overrides:
        raise PrunefxError(
            f"{spec} is not a pipeline config, so key=value overrides ({overrides[0]}) do not apply; "
            "give a config yaml (configs/yolo.yaml) or use the options (--flops 0.5)"
        )
    rounding = _round_to(round_to)
    config = prunefx.PlanConfig(  # no target given: PlanConfig's own default (half the FLOPs)

        ratio=ratio, flops=flops, params=params, latency=latency_target, scope=scope.value, round_to=rounding,
        ignore=tuple(ignore or ()), normalize=normalize.value,
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
    loaded = load_spec(spec, imgsz=imgsz, trust_checkpoint=trust_checkpoint, inputs=inputs or ())
    _check_train_mode(loaded)
    _prune_once(loaded, spec, config, criterion, run_dir, latency, deployment, steps=steps, refit=refit)


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

        from prunefx._config import load_yaml

        try:
            data = load_yaml(path.read_text(), arg)
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
    from prunefx.pipeline import run_config
    from prunefx.report import load_report, render_table

    console = new_console()
    run = run_config(path, overrides, log=console.print)
    console.print(render_table(load_report(run.root)))
    console.print(f"[green]report: {run.root / 'report.md'}[/green] (weights: {run.root / 'weights'})")


def _check_out(run_dir: Path, exist_ok: bool) -> None:
    """The run directory can be written: missing or empty, or (with --exist-ok) a prunefx run to replace."""
    from prunefx.pipeline.rundir import check_replaceable, is_run

    check_replaceable(run_dir)  # a file, or a directory that is not a run, is never replaced
    if run_dir.is_dir() and any(run_dir.iterdir()) and not exist_ok:
        what = "holds a run" if is_run(run_dir) else "is not empty"
        raise PrunefxError(f"{run_dir} already {what}; pick another --out or pass --exist-ok to replace it")


def _check_train_mode(loaded: "LoadedModel") -> None:
    """The original must run in train mode on the example input: the oracle checks the pruned model in both modes."""
    import torch
    from torch.utils._pytree import tree_leaves

    probe = copy.deepcopy(loaded.model).train()  # a copy: train-mode forwards update BatchNorm statistics
    try:
        with torch.no_grad():
            probe(*loaded.example_inputs)
    except Exception as exc:  # any failure means the check cannot run here
        shape = ", ".join("x".join(map(str, t.shape)) for t in tree_leaves(loaded.example_inputs)
                          if isinstance(t, torch.Tensor)) or "non-tensor"
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fix = "give inputs it accepts in train mode (--input)" if loaded.given else "give a larger --imgsz"
        raise PrunefxError(
            f"{loaded.name} cannot run in train mode on one {shape} input ({type(exc).__name__}: {detail}); the "
            f"pruned model is verified in eval and train mode, so {fix}"
        ) from exc


def _prune_once(
    loaded: "LoadedModel",
    spec: str,
    config: "PlanConfig",
    criterion: str,
    run_dir: Path,
    latency: bool,
    deployment: "Deployment",
    *,
    steps: int = 1,
    refit: bool = False,
) -> None:
    """The pipelines' stage loop without training (baseline -> prune -> report), run directory built aside."""
    from prunefx.pipeline.backends.spec import run_spec
    from prunefx.pipeline.job import ONE_SHOT, Job
    from prunefx.pipeline.records import PruneDone, read
    from prunefx.pipeline.run_config import PruneSpec, RunOptions
    from prunefx.plan import PruningPlan
    from prunefx.report import load_report, refit_line, render_table

    console = new_console()
    prune_spec = PruneSpec(criterion=criterion, plan=config, latency=latency, steps=steps, refit=refit)
    job = Job(prune=prune_spec, run=RunOptions(project=str(run_dir.parent), name=run_dir.name),
              config={"spec": spec, "prune": prune_spec.to_dict()}, stages=ONE_SHOT)
    status = "measuring latencies, planning against them, " if config.latency is not None else "analyzing, scoring, "
    with console.status(status + "planning, rewriting, verifying, measuring"):
        run = run_spec(job, loaded, run_dir, deployment=deployment, log=lambda _msg: None)
    report = load_report(run.root)
    pruned = read("prune", run.done("prune"))
    assert isinstance(pruned, PruneDone)
    console.print(render_table(report))
    console.print(PruningPlan.from_json((run.root / "plan.json").read_text()).summary())
    if pruned.latency_target:
        met = pruned.latency_target.met
        console.print(f"latency target: {pruned.latency_target.note}", style="green" if met else "yellow")
    for warning in report["warnings"]:
        console.print(f"[yellow]warning: {warning}[/yellow]")
    inexact = pruned.verify.startswith(("inexact by design", "skipped"))  # VerifyResult.headline(): not a proof
    console.print(f"verify: {pruned.verify}", style="yellow" if inexact else "green")
    if pruned.refit:
        console.print(refit_line(pruned.refit))
    else:  # a SPEC comes with no data: say what data would add
        console.print("no data: the cut was made from the weights and the example input alone; a few batches of "
                      "real inputs would re-fit it by least squares to the original's outputs (prunefx.prune(..., "
                      "calibration=[x1, x2, ...]) or a pipeline config with data; --refit re-fits on the example "
                      "input only)", style="yellow")
    for frozen in pruned.frozen_by_check:
        console.print(f"[yellow]frozen by the check: {frozen.name}: {frozen.reason}[/yellow]")
    console.print(f"run directory: {run.root} (report.md, report.html, report.json, plan.json, pruned.pt)")


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


def _plain(value: object) -> object:
    """An option value comparable with its declared default (enums by value, empty lists as None)."""
    if isinstance(value, Enum):
        return value.value
    return None if value in ((), []) else value
