"""What each stage of a pipeline run records in ``state.json``: one frozen dataclass per stage.

The runner's stages return these; :class:`~prunefx.pipeline.rundir.RunDir` keeps them as plain data (through
:func:`prunefx._config.to_dict`), with each stage's ``seconds`` and ``finished``, and :func:`read` builds them back
(through :func:`prunefx._config.from_dict`) for the later stages, the report and the CLI:

    info.update(to_state(PruneDone(source="sparse", verify="ok", widths=(Width(name="conv1", ...),), ...)))
    read("prune", run.done("prune")).verify        # "ok"

``state.json`` has the keys, values and key order it had before the stages' results were typed, so runs written
then resume now: the fields are in that order, and an optional field left at its default is not written
(``history`` only when the baseline was trained, ``skipped`` only when a stage did nothing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from prunefx._config import from_dict, to_dict
from prunefx.pipeline.rundir import RunError
from prunefx.train.sparsity import GammaStats

Row = Mapping[str, Any]  # one epoch of a training history, or one stage's metrics: as the backend measured them


@dataclass(frozen=True, kw_only=True)
class Skipped:
    """A stage its settings turned off (``prune.sparsity.epochs`` is 0, ...): no model, no results."""

    skipped: str  # which setting turned it off


@dataclass(frozen=True, kw_only=True)
class BaselineDone:
    """The baseline: where it came from and its metrics."""

    source: str  # "checkpoint PATH" or "trained from MODEL for N epochs"
    history: tuple[Row, ...] | None = None  # None: loaded from a checkpoint, not trained
    metrics: Row


@dataclass(frozen=True, kw_only=True)
class RankTrained:
    """What one rank fine-tuned (classification under DDP): every rank's pruned architecture is the same."""

    rank: int
    arch: str  # digest of every tensor's name and shape
    params: int


@dataclass(frozen=True, kw_only=True)
class TrainDone:
    """A training stage (fine-tune): per-epoch rows and the metrics of the trained model."""

    distill: Mapping[str, Any] | None = None  # the teacher and DistillConfig, when the stage distils
    ranks: tuple[RankTrained, ...] | None = None  # training from a pruned model: what each rank trained
    history: tuple[Row, ...]
    metrics: Row  # the final model's: the fine-tuned one, or the cut when fine-tuning made it worse
    # "finetuned", or "pruned": fine-tuning made the primary metric worse than the cut's, so the cut was kept as the
    # final weights (finetuned_metrics: what the fine-tuned model scored)
    kept: str = "finetuned"
    finetuned_metrics: Row | None = None


@dataclass(frozen=True, kw_only=True)
class SparsityDone:
    """The sparsity stage: a training stage plus where it left the penalised BatchNorms' gammas."""

    distill: Mapping[str, Any] | None = None
    ranks: tuple[RankTrained, ...] | None = None
    history: tuple[Row, ...]
    gammas: Mapping[str, float]  # GammaStats.flat(): the keys the report and users read ("below_0.01", "q0.5")
    warnings: tuple[str, ...]  # what the runner logs after the stage and the report lists first
    metrics: Row

    @property
    def gamma_stats(self) -> GammaStats:
        return GammaStats.from_flat(self.gammas)


@dataclass(frozen=True, kw_only=True)
class Width:
    """One pruned group's width before and after."""

    name: str
    before: int
    after: int


@dataclass(frozen=True, kw_only=True)
class FrozenGroup:
    """A group ``prune()`` froze because pruning it failed the oracle (the target was planned again without it)."""

    name: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class LatencyTarget:
    """A latency target's outcome: the rounds of planning against measured latency."""

    met: bool
    note: str
    rounds: tuple[Mapping[str, Any], ...]  # prunefx.plan.latency rounds, as dicts


@dataclass(frozen=True, kw_only=True)
class PruneDone:
    """The prune stage: what was pruned from which model, how it was checked, and the pruned model's metrics."""

    source: Literal["baseline", "sparse"]  # the role pruned
    verify: str  # the oracle's message, or why it was skipped
    widths: tuple[Width, ...]
    frozen_by_check: tuple[FrozenGroup, ...]
    latency_target: LatencyTarget | None = None
    macs_kept_estimate: float | None  # the planner's estimate (None: it had no MACs); written even when None
    warnings: tuple[str, ...]
    partial_capture: Mapping[str, Any] | None = None  # the model's own forward was not captured: what was pruned
    refit: Mapping[str, Any] | None = None  # prune.refit: prunefx.transform.Refit.to_dict() (errors before/after)
    # scope "sensitivity": the measured curves (prunefx.plan.sensitivity.SensitivityCurves.to_dict()) and their data
    sensitivity: Mapping[str, Any] | None = None
    # prune.depth: the blocks removed before the width cut, their scores, the depth oracle, the width cut's target
    depth: Mapping[str, Any] | None = None
    # prune.experts (llm task): the experts each MoE layer kept, the expert oracle, active parameters before/after
    experts: Mapping[str, Any] | None = None
    metrics: Row


@dataclass(frozen=True, kw_only=True)
class NarrowControl:
    """The narrow control's start: uniformly narrower, its MACs matched to the pruned model's."""

    macs: int
    macs_vs_pruned: float
    kept_fraction: float  # the median fraction of channels a group kept


@dataclass(frozen=True, kw_only=True)
class ControlRun:
    """One control trained from scratch."""

    start: str  # the runner's Start it trained from
    epochs: int
    metrics: Row
    history: tuple[Row, ...]


@dataclass(frozen=True, kw_only=True)
class ControlsDone:
    """The controls stage: each control's training, and how the untrained starts were made."""

    pruned_macs: int | None = None
    narrow: NarrowControl | None = None
    warnings: tuple[str, ...] = ()
    runs: Mapping[str, ControlRun]  # by role: narrow, narrow_ft, scratch


@dataclass(frozen=True, kw_only=True)
class ReportDone:
    """The report stage: the measured MACs kept and the files of the finished run."""

    macs_kept: float
    files: tuple[str, ...]


Record = Skipped | BaselineDone | TrainDone | SparsityDone | PruneDone | ControlsDone | ReportDone
RECORDS: dict[str, type[Record]] = {"baseline": BaselineDone, "sparsity": SparsityDone, "prune": PruneDone,
                                    "finetune": TrainDone, "controls": ControlsDone, "report": ReportDone}
# what RunDir.stage adds to every stage's entry, and the runner's digests of its files and results (digests.py)
_RUNDIR_KEYS = ("seconds", "finished", "files", "record")


def to_state(record: Record) -> dict[str, Any]:
    """``record`` as its stage's entry in ``state.json`` (optional fields left at their default are left out)."""
    data = to_dict(record)
    defaults = {f.name: to_dict(f.default) for f in dataclasses.fields(record) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}


def warnings_of(record: Record | None) -> tuple[str, ...]:
    """The warnings a stage recorded (the stages that can warn: sparsity, prune, controls)."""
    return record.warnings if isinstance(record, (SparsityDone, PruneDone, ControlsDone)) else ()


def read(stage: str, data: Mapping[str, Any] | None) -> Record | None:
    """The record of ``stage`` kept in ``state.json`` as ``data`` (None: the stage has not finished)."""
    if data is None:
        return None
    cls = Skipped if "skipped" in data else RECORDS[stage]
    fields = {k: v for k, v in data.items() if k not in _RUNDIR_KEYS}
    return from_dict(cls, fields, f"state.json stages.{stage}", error=RunError)


__all__ = ["RECORDS", "BaselineDone", "ControlRun", "ControlsDone", "FrozenGroup", "LatencyTarget", "NarrowControl",
           "PruneDone", "RankTrained", "Record", "ReportDone", "Skipped", "SparsityDone", "TrainDone", "Width",
           "read", "to_state", "warnings_of"]
