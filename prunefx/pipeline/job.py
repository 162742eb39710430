"""What a pipeline job is: its stages, the backend protocol a model family implements, the typed cuts and the run's
file names; shared by the runner, the stages and every backend."""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, Self

import torch
from torch import nn

from prunefx._config import ConfigError
from prunefx.analysis import DependencyGraph
from prunefx.metrics import Deployment
from prunefx.pipeline.progress import JobProgress
from prunefx.pipeline.records import (
    BaselineDone,
    PruneDone,
    RankTrained,
    Record,
    Skipped,
    TrainDone,
    read,
)
from prunefx.pipeline.run_config import PruneSpec, RunOptions, StageSpec
from prunefx.pipeline.rundir import RunDir, RunError
from prunefx.plan import PruningPlan
from prunefx.train.distributed import DistContext
from prunefx.train.sparsity import SparsityConfig

STAGES = ("baseline", "sparsity", "prune", "finetune", "controls", "report")
ONE_SHOT = ("baseline", "prune", "report")  # `prunefx prune SPEC`: nothing trained
CALIBRATION_BATCHES = 8  # batches of the backend's data a re-fit (prune.refit) or scope sensitivity runs on
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


def saved_plans(root: Path) -> Any:
    """The plan(s) the prune stage wrote in ``root``: its PruningPlan, or [DepthPlan, PruningPlan] after a depth
    cut (as :func:`prunefx.save` takes them)."""
    from prunefx.checkpoint import read_plan
    from prunefx.plan.depth import DepthPlan

    fix = "the run's files were changed since its prune stage: start a new run"
    width = read_plan(root / "plan.json", fix=fix, kind=PruningPlan, error=RunError)
    depth = root / DEPTH_PLAN
    return width if not depth.is_file() else [read_plan(depth, fix=fix, kind=DepthPlan, error=RunError), width]
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

# narrow / narrow_ft / scratch: the controls (see prunefx.pipeline.run_config.CONTROLS); *_init their untrained start
ModelRole = Literal["baseline", "sparse", "pruned", "finetuned", "narrow", "narrow_ft", "scratch", "narrow_init",
               "scratch_init"]
# init: the baseline's initialisation (seeded), not trained; any other: the saved model of that role
Start = Literal["init", "baseline", "pruned", "narrow_init", "scratch_init"]


@dataclass
class StageContext:
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


__all__ = ["Backend", "CALIBRATION_BATCHES", "Cuts", "DEPTH_PLAN", "Job", "LOWER_IS_BETTER", "ModelRole", "ONE_SHOT",
           "RECOVERY_DIR", "STAGES", "StageContext", "Start", "Trained", "WIDTH_AND_DEPTH", "WIDTH_ONLY",
           "check_target", "higher_is_better", "imported_on_call", "nothing_to_prune", "saved_plans"]
