"""The one stage loop behind every pipeline: baseline -> sparsity -> prune -> fine-tune -> report.

A backend (``pipeline/backends/``) does what differs between the model families: train, evaluate, load and save
a model of a role (baseline, sparse, pruned, fine-tuned), example inputs, extra costs. The runner owns the rest:
the stage order, resume (a finished stage is skipped), logging with the resume hint, the checks before any work,
and the stages that are the same for everyone (the sparsity setup, pruning and its checks, the report).

    backend = YoloBackend(job)                     # or ClassifyBackend(job, dist), SpecBackend(loaded)
    preflight(job.prune, backend)                  # nothing prunable / a target that prunes nothing: an error now
    run = open_run(job)
    execute(job, backend, run)                     # -> the RunDir, status complete

Distributed runs (classification under DDP) run the same loop in every rank: training stages everywhere, pruning
and the report in rank 0 while the others wait; only rank 0 writes files.
"""

from __future__ import annotations

import importlib
import json
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import numpy as np
import torch
from torch import nn

from prunefx._config import ConfigError, to_dict
from prunefx._io import atomic_write
from prunefx.analysis import DependencyGraph
from prunefx.errors import PrunefxError, ScoreScaleWarning, TiedScoresWarning
from prunefx.metrics import Deployment
from prunefx.pipeline import digests
from prunefx.pipeline.diagnose import score_warnings, sparsity_warnings
from prunefx.pipeline.progress import JobProgress
from prunefx.pipeline.records import (
    BaselineDone,
    ControlRun,
    ControlsDone,
    FrozenGroup,
    LatencyTarget,
    NarrowControl,
    PruneDone,
    RankTrained,
    Record,
    ReportDone,
    Skipped,
    SparsityDone,
    TrainDone,
    Width,
    read,
    to_state,
    warnings_of,
)
from prunefx.pipeline.run_config import PruneSpec, RunOptions, StageSpec
from prunefx.pipeline.rundir import RunDir, RunError, read_state, run_root
from prunefx.plan import PlanConfig, PruningPlan
from prunefx.plan.config import TARGETS
from prunefx.train.distributed import DistContext
from prunefx.train.loop import listening_to_epochs
from prunefx.train.sparsity import SparsityConfig, sparsity_stats

STAGES = ("baseline", "sparsity", "prune", "finetune", "controls", "report")
ONE_SHOT = ("baseline", "prune", "report")  # `prunefx prune SPEC`: nothing trained
CALIBRATION_BATCHES = 8  # batches of the backend's data a re-fit (prune.refit) or scope sensitivity runs on
# training runs in every rank, the rest in rank 0
_EVERY_RANK = frozenset({"baseline", "sparsity", "finetune", "controls"})

# narrow / narrow_ft / scratch: the controls (see prunefx.pipeline.run_config.CONTROLS); *_init their untrained start
ModelRole = Literal["baseline", "sparse", "pruned", "finetuned", "narrow", "narrow_ft", "scratch", "narrow_init",
               "scratch_init"]
# init: the baseline's initialisation (seeded), not trained; any other: the saved model of that role
Start = Literal["init", "baseline", "pruned", "narrow_init", "scratch_init"]
NARROW_TOLERANCE = 0.03  # the narrow control's MACs match the pruned model's within this fraction
RECOVERY_DIR = "finetune_recover"  # in weights/: the fine-tuning stage's prunefx.recover checkpoint, resumable
DEPTH_PLAN = "depth_plan.json"  # the prune stage's DepthPlan, beside plan.json, when prune.depth removed blocks


def imported_on_call(target: str) -> Callable[..., Any]:
    """The function ``"module:name"``, imported when first called (a backend's cuts name their library lazily)."""
    module, _, name = target.partition(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__qualname__ = call.__name__ = name
    return call


@dataclass(frozen=True)
class Cuts:
    """How a backend's models are cut: the width cut (:func:`prunefx.prune`'s signature) and the depth cut
    (:func:`prunefx.prune_depth`'s), None where the backend cannot save a depth-pruned model; ``before_refit``:
    with ``prune.refit`` the backend's ``evaluate`` also measures the model in memory right after the cut."""

    width: Callable[..., Any] = imported_on_call("prunefx:prune")
    depth: Callable[..., Any] | None = None
    before_refit: bool = False
    # pfx_hf.prune_experts' signature: whole MoE experts removed first (None: prune.experts is refused)
    experts: Callable[..., Any] | None = None


WIDTH_ONLY = Cuts()
# backends saving with prunefx.save (a list of plans) and evaluating the model in memory
WIDTH_AND_DEPTH = Cuts(depth=imported_on_call("prunefx:prune_depth"), before_refit=True)


@dataclass(frozen=True)
class Trained:
    """What a backend's training stage left: the trained model, per-epoch rows, and what else state.json records."""

    model: nn.Module
    history: Sequence[Mapping[str, Any]] = ()
    distill: Mapping[str, Any] | None = None  # the teacher and DistillConfig, when the stage distilled
    ranks: tuple[RankTrained, ...] | None = None  # training from a pruned model in several ranks: what each trained


class Backend(Protocol):
    """What differs between the pipelines; the runner does everything else."""

    dist: DistContext  # LOCAL unless training spans processes that all run the stage loop
    root: Path | None  # the run directory, set by the runner once it is open
    name: str  # the model as the report names it: "yolov8n.yaml", "torchvision:resnet18"
    checkpoint: str | None  # weights to start from instead of training the baseline
    baseline_epochs: int
    cuts: Cuts  # the width and depth cuts of the family (WIDTH_ONLY: prune.depth is refused)

    def architecture(self) -> nn.Module:
        """An untrained model of the pipeline's architecture (for checks and the channel analysis)."""

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """Batch-1 inputs at the pipeline's size: costs, latency, analysis."""

    def prune_inputs(self) -> tuple[torch.Tensor, ...]:
        """Inputs for pruning: bias compensation measures channel means on them, the oracle runs them."""

    def score_kwargs(self, criterion: str) -> dict[str, Any]:
        """Extra arguments of ``prunefx.importance.score`` (taylor: labelled calibration batches)."""

    def calibration(self, batches: int) -> list[Any]:
        """Up to ``batches`` batches of model inputs (or (inputs, targets) pairs) from the pipeline's data, for
        ``prune(calibration=...)``; a backend without data refuses with a ConfigError naming the fix."""

    @property
    def calibration_source(self) -> str:
        """What :meth:`calibration` returns, in words, for the report ("the first 256 training images")."""

    def from_checkpoint(self) -> nn.Module:
        """The model in ``checkpoint``, in every rank."""

    def fresh(self) -> nn.Module:
        """An untrained model of the architecture, initialised (seeded) as its family initialises it (controls)."""

    def train(self, out: ModelRole, start: Start, stage: StageSpec, sparsity: SparsityConfig | None) -> Trained:
        """Train from ``start`` for ``stage.epochs`` and save the result as ``out`` (rank 0 writes)."""

    def load(self, role: ModelRole) -> nn.Module:
        """The saved model of ``role`` (pruned shapes included)."""

    def save(self, model: nn.Module, role: ModelRole, plan: Any = None) -> None:
        """Write ``model`` as ``role`` (rank 0 only); pruned models carry their plan (with ``prune.depth`` the list
        [DepthPlan, PruningPlan], as :func:`saved_plans` reads them back)."""

    def evaluate(self, role: ModelRole, model: nn.Module, *, alone: bool = False) -> dict[str, float]:
        """Task metrics of ``model`` (saved as ``role``); ``alone``: only rank 0 runs this stage."""

    def extra_costs(self, model: nn.Module) -> dict[str, float]:
        """Costs in the family's own convention, reported beside the metrics (``yolo_gflops@640``)."""

    def deployment(self) -> Deployment | None:
        """Where latency is timed, for the report and a latency target (None: torch on the CPU, torch's threads)."""

    def settings(self) -> dict[str, Any]:
        """The backend's part of the report's settings (data, how metrics were measured, ...)."""

    @property
    def primary_metric(self) -> str:
        """The metric the verdict compares (higher is better): ``map50_95``, ``top1``."""

    @property
    def chance(self) -> float | None:
        """What a guess scores on the primary metric (1/classes for top-1), or None when it has no such floor."""


@dataclass(frozen=True)
class Job:
    """What the runner needs of a validated pipeline config."""

    prune: PruneSpec
    run: RunOptions
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)  # as given, for config.yaml
    stages: tuple[str, ...] = STAGES

    @classmethod
    def build(cls, config: Mapping[str, Any], config_name: str, prune: PruneSpec, **fields: Any) -> Self:
        """The job of a validated ``config`` (run options from its run keys), its inputs checked."""
        job = cls(prune=prune, run=RunOptions.parse(config, config_name), config=dict(config), **fields)
        job.check_inputs()
        return job

    def check_inputs(self) -> None:
        """Fail now, not after training, on inputs only the pipeline's backend knows how to check."""


def check_target(spec: PruneSpec, where: str = "prune.target") -> None:
    """A target that keeps everything prunes nothing: an error before any work, never an unpruned "pruned" model."""
    ((key, value),) = spec.target.items()
    if value == (0.0 if key == "ratio" else 1.0):
        raise ConfigError(f"{where}.{key}={value} keeps every channel, so there is nothing to prune; give a target "
                          f"that removes some (e.g. {where}.flops=0.5 or {where}.ratio=0.3)")


def preflight(spec: PruneSpec, backend: Backend) -> None:
    """Check on the untrained architecture that the plan can prune something, before any training.

    Catches a model with no prunable group and ``ignore`` / ``min_channels`` settings that leave none eligible
    (e.g. ``prune.ignore=['*']``), which would otherwise surface after the baseline and sparsity stages.
    """
    from prunefx import analyze
    from prunefx.plan import make_plan

    check_target(spec)
    if spec.depth.remove and backend.cuts.depth is None:
        raise ConfigError(f"prune.depth: the pipeline of {backend.name} cannot save a depth-pruned model yet (the "
                          "custom and llm tasks can); remove prune.depth")
    if spec.experts.keep < 1 and backend.cuts.experts is None:
        raise ConfigError(f"prune.experts: the pipeline of {backend.name} does not remove MoE experts (the llm task "
                          "does); remove prune.experts")
    dg = analyze(backend.architecture(), backend.example_inputs())
    ones = {g.id: np.ones(g.channels) for g in dg.groups if g.prunable}
    # Which groups may be pruned does not depend on the target or the rounding: a plain ratio plan tells.
    # (scope "sensitivity" plans on measured curves; which groups it may cut is the same as a global plan's)
    scope = "global" if spec.plan.scope == "sensitivity" else spec.plan.scope
    plan = make_plan(dg, ones, replace(spec.plan, **{**dict.fromkeys(TARGETS), "ratio": 0.5}, round_to=1, scope=scope))
    reason = nothing_to_prune(dg, plan, backend.name)
    if reason:
        raise ConfigError(reason)
    if spec.refit or spec.plan.scope == "sensitivity" or spec.depth.remove or spec.experts.keep < 1:
        backend.calibration(1)  # a backend without data refuses prune.refit / scope sensitivity now, before training


def nothing_to_prune(dg: DependencyGraph, plan: PruningPlan, model: str) -> str | None:
    """Why ``plan`` (made on ``dg``) can prune nothing at all, or None when it has groups to prune."""
    if plan.groups:
        return None
    prunable = [g for g in dg.groups if g.prunable]
    if not prunable:
        reasons = Counter(r for g in dg.groups for r in g.reasons)
        top = "; ".join(f"{r} ({n})" for r, n in reasons.most_common(3)) or "no channel groups"
        return (f"nothing in {model} can be pruned: all {len(dg.groups)} channel groups are frozen ({top}); "
                f"`prunefx analyze {model}` lists them")
    reasons = Counter(reason for _, reason in plan.skipped)
    top = "; ".join(f"{r} ({n})" for r, n in reasons.most_common(3))
    return (f"none of the {len(prunable)} prunable groups of {model} may be pruned: {top}; narrow the ignore "
            "patterns (--ignore, prune.ignore) or change the settings that exclude them (min_channels)")


def open_run(job: Job) -> RunDir:
    """Create, replace or resume the job's run directory (see :class:`RunDir`); a resumed run's finished stages
    must have left their files and records as they wrote them (:mod:`prunefx.pipeline.digests`)."""
    opts = job.run
    if opts.resume:
        check_unchanged(run_root(Path(opts.project), str(opts.name)))
    return RunDir.open(Path(opts.project), str(opts.name), job.config, resume=opts.resume, exist_ok=opts.exist_ok,
                       read_record=lambda stage, entry: read(stage, entry) if stage in job.stages else None)


def check_unchanged(root: Path) -> None:
    """Refuse, before anything is written, to resume ``root`` when a finished stage's plan, weights or record no
    longer match what the stage recorded (one RunError naming the file)."""
    try:
        state = read_state(root)
    except RunError:
        return  # no run, or a damaged state.json: RunDir.open says which, in its own words
    digests.verify(root, state)


def run_job(job: Job, backend: Backend, *, log: Callable[[str], None] = print) -> RunDir:
    """Check, open and run (or resume) every stage of a one-process ``job``; returns the finished run directory."""
    preflight(job.prune, backend)  # nothing prunable: an error before the directory exists
    run = open_run(job)
    log(f"run directory: {run.root}")
    result = execute(job, backend, run, log=log)
    assert result is not None  # one process: rank 0
    return result


def resume_hint(root: Path) -> str:
    """What to type to continue the run in ``root`` after fixing what stopped it."""
    return (f"finished stages are kept in {root}; fix the cause and continue with the same config plus: "
            f"resume=true name={root.name} project={root.parent}")


def execute(job: Job, backend: Backend, run: RunDir | None, *, log: Callable[[str], None] = print) -> RunDir | None:
    """Run (or resume) the job's stages; rank 0 holds ``run`` and returns it complete, other ranks get None."""
    dist = backend.dist
    root = Path(dist.broadcast(str(run.root) if dist.is_main else None))
    done = set(dist.broadcast(list(run.state["stages"]) if dist.is_main else None))
    log = log if dist.is_main else (lambda _msg: None)
    backend.root = root
    n = len(job.stages)
    progress = None
    if dist.is_main:
        plan = [(i, s, stage_epochs(job, backend, s)) for i, s in enumerate(job.stages, 1) if s not in done]
        progress = JobProgress.start(plan, n, log, latency_s=job.prune.latency_max_s if job.prune.latency else 0.0)
    ctx = _Ctx(job, backend, run, root, log, progress)
    stages = {"baseline": _baseline, "sparsity": _sparsity, "prune": _prune, "finetune": _finetune,
              "controls": _controls, "report": _report}
    name: str | None = None
    try:
        for i, name in enumerate(job.stages, 1):
            if name in done:
                log(f"[{i}/{n}] {name}: done earlier, skipped")
                continue
            log(f"[{i}/{n}] {name}")
            if dist.is_main:
                assert progress is not None
                progress.stage_started(name)
                with run.stage(name) as info, listening_to_epochs(progress.epoch_ended):
                    before = digests.snapshot(root)
                    record = stages[name](ctx)
                    info.update(to_state(record))
                    info.update(digests.stamp(root, before, info))  # what a resume proves unchanged
                for warning in warnings_of(record):
                    log(f"  warning: {warning}")
                log(f"[{i}/{n}] {name} finished in {info['seconds']:.0f} s")
                progress.stage_finished(name, info["seconds"])
            elif name in _EVERY_RANK:
                stages[name](ctx)
            dist.barrier()  # rank 0's files of this stage exist before any rank starts the next
        if dist.is_main:
            run.complete()
    except BaseException as exc:
        # Also between stages (a log line, the barrier, the final save): Ctrl-C there must not leave "running".
        if dist.is_main:
            run.stopped(exc, stage=name)
            log(f"stopped in stage {name!r}; {resume_hint(root)}")
        raise
    return run


def stage_epochs(job: Job, backend: Backend, stage: str) -> int:
    """The epochs ``stage`` trains in ``job`` (the job progress's plan; 0 for a stage that trains nothing)."""
    spec = job.prune
    if stage == "baseline":
        return 0 if backend.checkpoint is not None else backend.baseline_epochs
    if stage == "sparsity":
        return spec.sparsity.epochs
    if stage == "finetune":
        return spec.finetune.epochs
    if stage == "controls":
        return sum(epochs for _, _, epochs in control_runs(spec, backend.baseline_epochs))
    return 0


@dataclass
class _Ctx:
    job: Job
    backend: Backend
    run: RunDir | None  # rank 0 only
    root: Path
    log: Callable[[str], None]
    progress: JobProgress | None = None  # rank 0 only

    def done(self, stage: str) -> Record | None:
        """The record of ``stage`` if it finished (in rank 0; other ranks: None)."""
        return read(stage, self.run.done(stage)) if self.run is not None else None

    def ran(self, stage: str) -> bool:
        """Whether ``stage`` produced a model (it is part of the job and was not skipped)."""
        return stage in self.job.stages and not isinstance(self.done(stage), Skipped)

    def metrics(self, stage: str) -> dict[str, Any]:
        """The metrics ``stage`` measured on its model ({} when it has none)."""
        record = self.done(stage)
        return dict(record.metrics) if isinstance(record, (BaselineDone, TrainDone, PruneDone)) else {}


def _baseline(ctx: _Ctx) -> BaselineDone:
    b = ctx.backend
    history = None
    if b.checkpoint is not None:
        model = b.from_checkpoint()
        source = f"checkpoint {b.checkpoint}"
        b.save(model, "baseline")
    else:
        trained = b.train("baseline", "init", StageSpec(b.baseline_epochs), None)
        model, history = trained.model, tuple(trained.history)
        source = f"trained from {b.name} for {b.baseline_epochs} epochs"
    return BaselineDone(source=source, history=history, metrics=b.evaluate("baseline", model))


def _sparsity(ctx: _Ctx) -> SparsityDone | Skipped:
    sp, b = ctx.job.prune.sparsity, ctx.backend
    if sp.epochs == 0:
        return Skipped(skipped="prune.sparsity.epochs is 0")
    config = sp.config.resolved(b.architecture(), b.example_inputs())  # residual BNs named once, in every rank
    # scratch: the baseline's initial weights, trained with the penalty from the first step
    trained = b.train("sparse", "init" if sp.start == "scratch" else "baseline", sp, config)
    # The saved model's gammas: what the prune stage ranks (for YOLO the EMA weights ultralytics saves).
    saved = b.load("sparse") if b.dist.is_main else trained.model
    thresholds = sorted({1e-3, 1e-2, 1e-1, config.threshold})
    gammas = sparsity_stats(saved, modules=_penalised(saved, config), thresholds=thresholds)
    return SparsityDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks,
                        gammas=gammas.flat(), warnings=tuple(sparsity_warnings(gammas, config)),
                        metrics=b.evaluate("sparse", trained.model))


def _penalised(model: nn.Module, config: SparsityConfig) -> list[str]:
    from prunefx.train.sparsity import BNSparsity

    return list(BNSparsity(model, exclude=config.exclude).modules)


def _prune(ctx: _Ctx) -> PruneDone:
    from prunefx.report import write_graph
    from prunefx.view.graph_data import graph_data

    spec, b = ctx.job.prune, ctx.backend
    source: ModelRole = "sparse" if ctx.ran("sparsity") else "baseline"
    model = b.load(source).eval()
    kwargs = b.score_kwargs(spec.criterion)
    if spec.refit or spec.plan.scope == "sensitivity":  # taylor's labelled batches serve these too: passed once
        kwargs.setdefault("calibration", b.calibration(CALIBRATION_BATCHES))
    depth, experts, config = None, None, spec.plan
    if spec.depth.remove or spec.experts.keep < 1:
        from prunefx.metrics import measure

        before = measure(model, b.example_inputs())
        experts = _cut_experts(ctx, model) if spec.experts.keep < 1 else None
        depth = _cut_depth(ctx, model) if spec.depth.remove else None
        config, restated = _width_config(ctx, before, measure(model, b.example_inputs()))
        (depth.record if depth is not None else experts).update(restated)
    cut: dict[str, float] = {}  # the metrics right after the cut, before the re-fit changes the weights
    if spec.refit and spec.steps == 1 and b.cuts.before_refit:
        def measure_cut(pruned: nn.Module) -> None:
            ctx.log("  the cut alone, before the re-fit:")
            cut.update(b.evaluate("pruned", pruned, alone=True))

        kwargs["on_cut"] = measure_cut
    with warnings.catch_warnings():  # score_warnings below logs tied scores with the run's own fix, once
        warnings.simplefilter("ignore", TiedScoresWarning)
        warnings.simplefilter("ignore", ScoreScaleWarning)  # the report carries it below, as prune() phrased it
        result = b.cuts.width(model, b.prune_inputs(), config, criterion=spec.criterion, check=spec.verify,
                              bias_compensation=spec.bias_compensation, deployment=b.deployment(), steps=spec.steps,
                              refit=spec.refit, **kwargs)
    reason = nothing_to_prune(result.graph, result.plan, b.name)
    if reason:
        raise ConfigError(reason)
    if not result.plan.pruned:
        target = ", ".join(f"{k} {v:g}" for k, v in spec.target.items())
        raise ConfigError(f"the target ({target}) is already met: the plan removes no channel from {b.name}; "
                          "lower it (e.g. prune.target.flops=0.5, --flops 0.5)")
    if result.verified is not None and not result.verified.accepted:  # proven, or inexact by design (labelled)
        raise PrunefxError(f"the pruned model differs from the masked original: {result.verified.message}")
    verify = result.verified.headline() if result.verified is not None else "skipped (prune.verify=false)"
    latency = None
    if result.latency is not None:  # a latency target: the rounds of planning against measured latency
        latency = LatencyTarget(met=result.latency.met, note=result.latency.note,
                                rounds=tuple(asdict(r) for r in result.latency.rounds))
    est = result.plan.estimate
    sparsity = ctx.done("sparsity")
    found = score_warnings(result, spec.criterion, sparsity.gamma_stats if isinstance(sparsity, SparsityDone) else None)
    if note := result.plan.score_scale_note():  # raw scores of very differently scaled groups under one threshold
        found.append(note)
    partial = None
    if result.parts is not None:  # the model's own forward was not captured: what was pruned and what was not
        partial = result.parts.to_dict()
        found.append(result.parts.describe().replace("\n", "; "))
    atomic_write(ctx.root / "plan.json", result.plan.to_json().encode())
    if depth is not None:
        atomic_write(ctx.root / DEPTH_PLAN, json.dumps(depth.plan.to_dict(), indent=1).encode())
    write_graph(ctx.root, graph_data(result.graph, result.plan))  # report.html draws the graph from it
    b.save(result.model, "pruned", result.plan if depth is None else [depth.plan, result.plan])
    ctx.log(f"  {len(result.plan.pruned)} of {len(result.plan.groups)} groups pruned; verify: {verify}")
    return PruneDone(
        source=source,
        verify=verify,
        widths=tuple(Width(name=result.graph.groups[g.group].label, before=g.before, after=g.after)
                     for g in result.plan.groups),
        # groups prune() froze because pruning them failed the oracle (the target was planned again without them)
        frozen_by_check=tuple(FrozenGroup(name=result.graph.groups[g].label, reason=why)
                              for g, why in result.frozen_by_check),
        latency_target=latency,
        macs_kept_estimate=est["macs_after"] / est["macs_before"] if est.get("macs_before") else None,
        warnings=tuple(found),
        partial_capture=partial,
        refit=None if result.refit is None else {**result.refit.to_dict(), "calibration": b.calibration_source,
                                                 **({"metrics_before": cut} if cut else {})},
        depth=None if depth is None else depth.record,
        experts=experts,
        sensitivity=({**result.sensitivity.to_dict(), "calibration": b.calibration_source}
                     if result.sensitivity is not None else None),
        metrics=b.evaluate("pruned", result.model, alone=True),  # only rank 0 runs this stage
    )


@dataclass(frozen=True)
class _DepthCut:
    plan: Any  # the DepthPlan
    record: dict[str, Any]  # PruneDone.depth


def _cut_depth(ctx: _Ctx, model: nn.Module) -> _DepthCut:
    """Remove ``prune.depth.remove`` blocks of ``model`` in place, checked by the depth oracle."""
    spec, b = ctx.job.prune, ctx.backend
    d = spec.depth
    assert b.cuts.depth is not None  # preflight refused prune.depth otherwise
    result = b.cuts.depth(model, b.prune_inputs(), remove=d.remove, criterion=d.criterion, iterative=d.iterative,
                          calibration=b.calibration(CALIBRATION_BATCHES), check=spec.verify)
    verify = result.verified.message if result.verified is not None else "skipped (prune.verify=false)"
    ctx.log(f"  depth: removed {', '.join(result.plan.remove)} ({d.criterion}); verify: {verify}")
    record = {"removed": list(result.plan.remove), "criterion": result.plan.criterion,
              "scores": {p: s for p, s in result.plan.scores}, "verify": verify, "warnings": list(result.warnings)}
    return _DepthCut(result.plan, record)


def _cut_experts(ctx: _Ctx, model: nn.Module) -> dict[str, Any]:
    """Remove ``1 - prune.experts.keep`` of every MoE layer's experts in place, checked by the expert oracle."""
    spec, b = ctx.job.prune, ctx.backend
    e = spec.experts
    assert b.cuts.experts is not None  # preflight refused prune.experts otherwise
    result = b.cuts.experts(model, b.calibration(CALIBRATION_BATCHES), keep=e.keep, criterion=e.criterion,
                            check=spec.verify)
    verify = result.verified.message if result.verified is not None else "skipped (prune.verify=false)"
    kept = {path: list(k) for path, k in result.plan.keep}
    ctx.log(f"  experts: {len(next(iter(kept.values()), []))} kept per MoE layer ({e.criterion}); verify: {verify}")
    return {"kept": kept, "criterion": e.criterion, "active_params": list(result.active_params), "verify": verify,
            "warnings": list(result.warnings)}


def _width_config(ctx: _Ctx, before: Any, after: Any) -> tuple[PlanConfig, dict[str, Any]]:
    """The width plan's config after the expert / depth cuts: the target, a fraction of the model given, restated
    for the model they left; and what they kept."""
    spec = ctx.job.prune
    ((key, value),) = spec.target.items()
    kept = {"params": after.params / before.params, "flops": after.macs / before.macs}
    width = value if key == "ratio" else value / kept[key]
    if key != "ratio" and width >= 1.0:
        raise ConfigError(f"prune.depth / prune.experts alone keep {kept[key]:.3f} of the {key}, at or under the "
                          f"target prune.target.{key}={value:g}, leaving the width cut nothing to do; cut fewer "
                          "blocks or experts, or lower the target")
    restated = {"params_kept": kept["params"], "macs_kept": kept["flops"], "width_target": {key: width}}
    return replace(spec.plan, **{key: width}), restated


def saved_plans(root: Path) -> Any:
    """The plan(s) the prune stage wrote in ``root``: its PruningPlan, or [DepthPlan, PruningPlan] after a depth
    cut (as :func:`prunefx.save` takes them)."""
    from prunefx.checkpoint import read_plan
    from prunefx.plan.depth import DepthPlan

    fix = "the run's files were changed since its prune stage: start a new run"
    width = read_plan(root / "plan.json", fix=fix, kind=PruningPlan, error=RunError)
    depth = root / DEPTH_PLAN
    return width if not depth.is_file() else [read_plan(depth, fix=fix, kind=DepthPlan, error=RunError), width]


KEPT_CUT = "fine-tune made it worse: kept the cut model"
# metric names (split at non-alphanumerics) that fall as the model improves; any other name rises
LOWER_IS_BETTER = frozenset({"loss", "mse", "mae", "rmse", "nll", "error", "err", "ppl", "perplexity", "wer", "cer",
                             "bpb", "bpc"})


def higher_is_better(backend: Backend) -> bool:
    """Which way the backend's primary metric improves: its ``metric_goal`` ("max" / "min") when it has one, else
    lower for a name with a word of :data:`LOWER_IS_BETTER` (``val_loss``, ``ppl``, ``mse``), higher otherwise."""
    goal = getattr(backend, "metric_goal", None)
    if goal in ("max", "min"):
        return goal == "max"
    return not set(re.split(r"[^a-z0-9]+", backend.primary_metric.lower())) & LOWER_IS_BETTER


def _finetune(ctx: _Ctx) -> TrainDone | Skipped:
    ft, b = ctx.job.prune.finetune, ctx.backend
    if ft.epochs == 0:
        return Skipped(skipped="prune.finetune.epochs is 0")
    trained = b.train("finetuned", "pruned", ft, None)
    metrics = b.evaluate("finetuned", trained.model)
    cut, key = ctx.metrics("prune"), b.primary_metric  # the prune stage's record: rank 0 only, which decides
    before, after = cut.get(key), metrics.get(key)
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and (
            after < before if higher_is_better(b) else after > before):
        # the user's metric is the judge: a fine-tune that lowered it is not the run's result
        b.save(b.load("pruned"), "finetuned", saved_plans(ctx.root))
        ctx.log(f"  {KEPT_CUT} ({key} {before:.4g} after the cut, {after:.4g} fine-tuned; "
                f"{'higher' if higher_is_better(b) else 'lower'} is better)")
        return TrainDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks,
                         metrics=cut, kept="pruned", finetuned_metrics=metrics)
    return TrainDone(history=tuple(trained.history), distill=trained.distill, ranks=trained.ranks, metrics=metrics)


def control_runs(spec: PruneSpec, baseline_epochs: int) -> list[tuple[ModelRole, Start, int]]:
    """The control trainings of ``spec``: (role, start, epochs); total = baseline + sparsity + fine-tune epochs."""
    total = baseline_epochs + spec.sparsity.epochs + spec.finetune.epochs
    runs: list[tuple[ModelRole, Start, int]] = []
    if "narrow" in spec.controls:
        runs.append(("narrow", "narrow_init", total))
        if spec.finetune.epochs:
            runs.append(("narrow_ft", "narrow_init", spec.finetune.epochs))
    if "scratch" in spec.controls:
        runs.append(("scratch", "scratch_init", total))
    return runs


def narrow_model(fresh: nn.Module, inputs: tuple[torch.Tensor, ...], macs_goal: int,
                 base: PlanConfig) -> tuple[nn.Module, PruningPlan, int]:
    """``fresh`` made uniformly narrower (every prunable group keeps one common fraction) until its MACs are
    ``macs_goal`` within NARROW_TOLERANCE; returns the model, its plan and its MACs (the closest found).

    The fraction is bisected against measured MACs (the planner's estimate ignores rounding and frozen groups).
    With ``base.round_to`` > 1 one common fraction may not reach the goal (a 64-wide stem moves in 12.5% steps);
    then widths are kept exact (round_to 1), which a uniform width multiple needs to match a budget.
    """
    best: tuple[nn.Module, PruningPlan, int] | None = None
    for round_to in dict.fromkeys((base.round_to, 1)):
        found = _bisect_uniform(fresh, inputs, macs_goal, replace(base, round_to=round_to))
        if best is None or abs(found[2] / macs_goal - 1) < abs(best[2] / macs_goal - 1):
            best = found
        if abs(best[2] / macs_goal - 1) <= NARROW_TOLERANCE:
            break
    assert best is not None
    return best


def _bisect_uniform(fresh: nn.Module, inputs: tuple[torch.Tensor, ...], macs_goal: int,
                    base: PlanConfig) -> tuple[nn.Module, PruningPlan, int]:
    import copy

    from prunefx import prune
    from prunefx.metrics import measure

    lo, hi, target = 0.0, 1.0, macs_goal / measure(fresh, inputs).macs
    best: tuple[nn.Module, PruningPlan, int] | None = None
    for _ in range(10):  # bisection on the planner's FLOPs knob against measured MACs (monotone in the knob)
        config = replace(base, **{**dict.fromkeys(TARGETS), "flops": min(1.0, max(1e-3, target))}, scope="local",
                         max_ratio=max(base.max_ratio, 0.95))
        result = prune(copy.deepcopy(fresh), inputs, config, criterion="l1", check=False, bias_compensation=False)
        macs = measure(result.model, inputs).macs
        if best is None or abs(macs / macs_goal - 1) < abs(best[2] / macs_goal - 1):
            best = (result.model, result.plan, macs)
        if abs(macs / macs_goal - 1) <= NARROW_TOLERANCE / 3:
            break
        lo, hi = (lo, target) if macs > macs_goal else (target, hi)
        if hi - lo < 0.01:  # the knob's steps are coarser than this: rounding decides, not the knob
            break
        target = (lo + hi) / 2
    assert best is not None
    return best


def _controls(ctx: _Ctx) -> ControlsDone | Skipped:
    from prunefx import analyze
    from prunefx.metrics import measure
    from prunefx.transform import apply_plan

    spec, b = ctx.job.prune, ctx.backend
    if not spec.controls:
        return Skipped(skipped="prune.controls is empty")
    runs = control_runs(spec, b.baseline_epochs)
    x = b.example_inputs()
    goal, narrow, off = None, None, ()
    if b.dist.is_main:  # the controls' untrained starts, saved for every rank (and for the record)
        pruned = b.load("pruned")
        plan = saved_plans(ctx.root)
        plan = plan[-1] if isinstance(plan, list) else plan  # the width plan, after a depth cut too
        goal = measure(pruned, x).macs
        if "narrow" in spec.controls:
            model, narrow_plan, macs = narrow_model(b.fresh(), x, goal, spec.plan)
            b.save(model, "narrow_init", narrow_plan)
            kept = [g.after / g.before for g in narrow_plan.groups if g.before]
            narrow = NarrowControl(macs=macs, macs_vs_pruned=macs / goal,
                                   kept_fraction=float(np.median(kept)) if kept else 1.0)
            if abs(macs / goal - 1) > NARROW_TOLERANCE:
                off = (f"the narrow control's MACs are {macs / goal - 1:+.1%} off the pruned model's "
                       f"(rounding: round_to={spec.plan.round_to}); the verdict compares unequal budgets",)
        if "scratch" in spec.controls:
            fresh = b.fresh()
            dg = analyze(fresh, tuple(torch.zeros(s) for s in plan.input_shapes))
            b.save(apply_plan(fresh, dg, plan), "scratch_init", plan)
    results: dict[str, ControlRun] = {}
    for role, start, epochs in runs:
        ctx.log(f"  control {role}: from scratch ({start}) for {epochs} epochs")
        trained = b.train(role, start, StageSpec(epochs), None)
        metrics = b.evaluate(role, trained.model)
        results[role] = ControlRun(start=start, epochs=epochs, metrics=metrics, history=tuple(trained.history))
    return ControlsDone(pruned_macs=goal, narrow=narrow, warnings=off, runs=results)


_CONTROL_WHAT = {
    "narrow": "uniformly narrower, from scratch, total epochs",
    "narrow_ft": "uniformly narrower, from scratch, fine-tune epochs",
    "scratch": "pruned architecture re-initialised, from scratch, total epochs",
}


def _control_rows(ctx: _Ctx, x: tuple[torch.Tensor, ...]) -> dict[str, Any] | None:
    """The controls' block of the report: each trained control measured like the stages, with its metrics."""
    from prunefx.metrics import measure
    from prunefx.report import Stage

    done = ctx.done("controls")
    if not ctx.ran("controls") or not isinstance(done, ControlsDone) or not done.runs:
        return None
    b, spec = ctx.backend, ctx.job.prune
    rows = []
    for role, run in done.runs.items():
        model = b.load(role).cpu().eval()
        rows.append((role, _CONTROL_WHAT[role], run.epochs,
                     Stage(measure(model, x), None, {**run.metrics, **b.extra_costs(model)})))
    total = b.baseline_epochs + spec.sparsity.epochs + spec.finetune.epochs
    return {"metric": b.primary_metric, "total_epochs": total, "finetune_epochs": spec.finetune.epochs, "runs": rows,
            "chance": b.chance}


def _report(ctx: _Ctx) -> ReportDone:
    from prunefx.metrics import compare_latency, measure
    from prunefx.report import Stage, build_report, write_report

    spec, b, run = ctx.job.prune, ctx.backend, ctx.run
    x = b.example_inputs()
    roles: dict[str, tuple[ModelRole, str]] = {"baseline": ("baseline", "baseline"), "pruned": ("pruned", "prune")}
    if ctx.ran("finetune"):
        roles["finetuned"] = ("finetuned", "finetune")
    models = {name: b.load(role).cpu().eval() for name, (role, _) in roles.items()}
    # The stages are timed in alternating rounds, so a slow spell of the machine hits them all alike.
    timed = compare_latency(models, x, b.deployment(), max_seconds=spec.latency_max_s,
                            progress=ctx.progress.latency_round if ctx.progress else None) if spec.latency else {}
    cut = next((t.cut_short for t in timed.values() if t.cut_short), None)
    if cut:
        ctx.log(f"  latency: {cut} (prune.latency_max_s); the report's timings rest on fewer repeats")
    stages = {name: Stage(measure(m, x), timed.get(name),
                          {**ctx.metrics(roles[name][1]), **b.extra_costs(m)})
              for name, m in models.items()}
    pr = ctx.done("prune")
    assert isinstance(pr, PruneDone)  # the report follows the prune stage in every job
    sparsity = ctx.done("sparsity")
    sparse = sparsity if isinstance(sparsity, SparsityDone) else None
    settings = {
        "config": dict(ctx.job.config),
        "criterion": spec.criterion,
        "target": spec.target,
        "verify": pr.verify,
        "pruned_from": pr.source,
        "stage_seconds": {k: v.get("seconds") for k, v in run.state["stages"].items()},
        **({"sparsity": {"metrics": to_dict(sparse.metrics) if sparse else None,
                         "gammas": to_dict(sparse.gammas) if sparse else None}}
           if "sparsity" in ctx.job.stages else {}),
        **({"latency_timing": {"max_seconds": spec.latency_max_s, "rounds": next(iter(timed.values())).rounds,
                               "cut_short": cut}} if timed else {}),
        **({"latency_target": to_dict(pr.latency_target)} if pr.latency_target else {}),
        **({"experts": dict(pr.experts)} if pr.experts else {}),  # the experts each MoE layer kept, first
        **({"depth": dict(pr.depth)} if pr.depth else {}),  # the blocks the depth cut removed, before the width cut
        **({"refit": dict(pr.refit)} if pr.refit else {}),  # calibration error before/after, per layer
        **({"sensitivity": dict(pr.sensitivity)} if pr.sensitivity else {}),  # per-group damage curves, plotted
        **b.settings(),
    }
    warnings = [w for s in ("sparsity", "prune", "controls") for w in warnings_of(ctx.done(s))]
    ft = ctx.done("finetune")
    if isinstance(ft, TrainDone) and ft.kept == "pruned":  # both models' metrics, and which one the run kept
        key = b.primary_metric
        settings["finetune"] = {"kept": "pruned", "note": KEPT_CUT, "metric": key,
                                "higher_is_better": higher_is_better(b), "metrics_cut": dict(ft.metrics),
                                "metrics_finetuned": dict(ft.finetuned_metrics or {})}
        warnings.append(f"{KEPT_CUT}: {key} {ft.metrics[key]:.4g} after the cut, "
                        f"{(ft.finetuned_metrics or {})[key]:.4g} after fine-tuning "
                        f"({'higher' if higher_is_better(b) else 'lower'} is better); the final weights are the cut's")
    report = build_report(model=b.name, baseline=stages["baseline"], pruned=stages["pruned"],
                          finetuned=stages.get("finetuned"), settings=settings, warnings=warnings,
                          widths=[(w.name, w.before, w.after) for w in pr.widths],
                          controls=_control_rows(ctx, x))
    write_report(ctx.root, report)
    return ReportDone(macs_kept=report["stages"]["pruned"]["macs"] / report["stages"]["baseline"]["macs"],
                      files=tuple(sorted(p.name for p in ctx.root.iterdir() if p.is_file())))


__all__ = ["Backend", "Cuts", "DEPTH_PLAN", "Job", "KEPT_CUT", "LOWER_IS_BETTER", "NARROW_TOLERANCE", "ONE_SHOT",
           "STAGES", "Trained", "WIDTH_AND_DEPTH", "WIDTH_ONLY", "check_target", "check_unchanged", "control_runs",
           "execute", "higher_is_better", "imported_on_call", "narrow_model", "nothing_to_prune", "open_run",
           "preflight", "resume_hint", "run_job", "saved_plans", "stage_epochs"]
