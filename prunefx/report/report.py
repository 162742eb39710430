"""Pruning-run report: build it from plain measurements, validate it, load it back (``write.py`` writes it).

``report.json`` (schema ``prunefx.report/1``) is :class:`Report` as JSON: the dataclasses below are the schema,
and ``Report.from_dict`` is its validator (unknown keys, missing keys and wrong types are errors naming the key).
In short: ``model``, ``created`` (ISO-8601 UTC), ``prunefx`` (version), ``machine``, ``timing`` (how latency was
timed, once, and why it is unreliable when it is), ``conventions`` (how MACs, FLOPs = 2 x MACs, norms, latency,
deltas are counted), ``settings`` (the caller's, verbatim), ``stages`` (``baseline`` and ``pruned`` always,
``finetuned`` optionally: costs, latency, task metrics and their change vs the baseline), ``widths`` (per pruned
group), ``sweep`` (accuracy vs FLOPs points) and ``warnings`` (what the numbers cannot support, e.g. tied scores;
report.md lists them first).

Deltas: ``abs = stage - baseline`` and ``rel = abs / baseline`` (null when the baseline is 0); cost
deltas cover macs, flops, params, size_bytes (when both are known) and, when both stages were timed,
latency_median_ms.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prunefx._config import from_dict, to_dict
from prunefx._io import read_json
from prunefx.errors import PrunefxError
from prunefx.metrics import CONVENTIONS as COUNT_CONVENTIONS
from prunefx.metrics import Latency, Measurement
from prunefx.metrics.latency import CONVENTION as LATENCY_CONVENTION

SCHEMA = "prunefx.report/1"
STAGES = ("baseline", "pruned", "finetuned")
JSON_NAME = "report.json"


class ReportError(PrunefxError, ValueError):
    """A report is malformed or missing; the message lists what is wrong and what to do."""


@dataclass(frozen=True)
class Stage:
    """One row of the report: the cost of one model state and, optionally, its task metrics."""

    measurement: Measurement
    latency: Latency | None = None
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class SweepPoint:
    """One pruning ratio of a sweep: its cost and task metrics, for the accuracy-vs-FLOPs curve."""

    ratio: float
    measurement: Measurement
    metrics: Mapping[str, float] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Delta:
    """A change vs the baseline: ``abs = stage - baseline``, ``rel = abs / baseline`` (None when it is 0)."""

    abs: float
    rel: float | None
    noise: str | None = None  # latency only: why the change is not vouched for (renderers print this instead)


@dataclass(frozen=True)
class StageRecord:
    """One stage in report.json: what :class:`Measurement` counts, its latency, metrics and deltas."""

    macs: int
    flops: int  # 2 x macs
    params: int
    buffers: int
    size_bytes: int | None  # None: the model was on the meta device
    per_module_macs: dict[str, int]
    per_op_macs: dict[str, int]
    uncounted_ops: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    ran_on: str
    latency: Latency | None  # None: not timed
    metrics: dict[str, float]  # task metrics: top1, map50_95, ...
    delta: dict[str, Delta]  # costs vs baseline ({} for the baseline)
    metrics_delta: dict[str, Delta]  # shared metrics vs baseline

    def __post_init__(self) -> None:
        if self.flops != 2 * self.macs:
            raise ReportError(f"flops ({self.flops}) must be 2 x macs ({self.macs})")


@dataclass(frozen=True)
class Timing:
    """How the report's latencies were timed, stated once, and why they are unreliable when they are."""

    backend: str
    deployed: str
    device: str
    threads: int
    batch_size: int
    rounds: int
    alternating: bool
    load_avg: float | None
    cpu_count: int | None
    noise: str | None


@dataclass(frozen=True)
class Width:
    """One pruned group's channels before and after."""

    name: str
    before: int
    after: int


@dataclass(frozen=True)
class CostRow:
    """What a sweep point and a control record alike: a model's cost and its task metrics."""

    macs: int
    flops: int  # 2 x macs
    params: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class SweepRow(CostRow):
    """One point of an accuracy-vs-FLOPs sweep."""

    ratio: float


@dataclass(frozen=True)
class ControlRow(CostRow):
    """One control: a model of the pruned model's budget trained from scratch (see ``prune.controls``)."""

    name: str  # narrow (total epochs), narrow_ft (fine-tune epochs), scratch (pruned architecture, total epochs)
    what: str
    epochs: int


@dataclass(frozen=True)
class Controls:
    """The controls of a run and the budget they were given, for the verdict."""

    metric: str  # the metric the verdict compares (higher is better)
    total_epochs: int  # baseline + sparsity + fine-tune
    finetune_epochs: int
    runs: tuple[ControlRow, ...]
    chance: float | None = None  # the metric of a guess (1/classes for top-1), when known: the verdict's floor


@dataclass(frozen=True)
class Report:
    """A whole report.json; ``Report.from_dict(d)`` validates ``d`` and ``to_dict`` writes it back."""

    schema: str
    model: str  # what was pruned, e.g. "torchvision:resnet50"
    created: str
    prunefx: str
    machine: dict[str, Any]
    conventions: dict[str, str]
    settings: dict[str, Any]
    stages: dict[str, StageRecord]
    timing: Timing | None = None  # how latency was timed, once (None: not timed)
    widths: tuple[Width, ...] = ()
    sweep: tuple[SweepRow, ...] = ()
    warnings: tuple[str, ...] = ()
    controls: Controls | None = None  # models of the same budget trained from scratch; report.md ends with a verdict

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise ReportError(f"schema: expected {SCHEMA!r}, got {self.schema!r}")
        missing = [s for s in STAGES[:2] if s not in self.stages]
        unknown = [s for s in self.stages if s not in STAGES]
        if missing or unknown:
            raise ReportError(f"stages: {'missing' if missing else 'unknown stage'} {(missing or unknown)[0]!r} "
                              f"(allowed: {', '.join(STAGES)}; baseline and pruned are required)")

    @classmethod
    def from_dict(cls, d: Any) -> Report:
        return from_dict(cls, d, error=ReportError)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)


def _delta(value: float, base: float) -> dict[str, float | None]:
    return {"abs": value - base, "rel": (value - base) / base if base else None}


def _stage_dict(stage: Stage, baseline: Stage | None) -> dict[str, Any]:
    out = {
        **stage.measurement.to_dict(),
        "latency": stage.latency.to_dict() if stage.latency else None,
        "metrics": {k: float(v) for k, v in stage.metrics.items()},
        "delta": {},
        "metrics_delta": {},
    }
    if baseline is not None:
        base = baseline.measurement.to_dict()
        costs = ("macs", "flops", "params", "size_bytes")
        out["delta"] = {k: _delta(out[k], base[k]) for k in costs if None not in (out[k], base[k])}
        if stage.latency and baseline.latency:
            out["delta"]["latency_median_ms"] = _delta(stage.latency.median_ms, baseline.latency.median_ms)
            noise = stage.latency.noise or baseline.latency.noise
            if noise:  # the change is not vouched for: renderers print the reason instead of the percentage
                out["delta"]["latency_median_ms"]["noise"] = noise
        out["metrics_delta"] = {
            k: _delta(float(v), float(baseline.metrics[k])) for k, v in stage.metrics.items() if k in baseline.metrics
        }
    return out


def _cost_row(measurement: Measurement, metrics: Mapping[str, float]) -> dict[str, Any]:
    """A :class:`CostRow` as report.json holds it: the measured cost and the metrics as floats."""
    return {"macs": measurement.macs, "flops": measurement.flops, "params": measurement.params,
            "metrics": {k: float(v) for k, v in metrics.items()}}


def _version() -> str:
    try:
        return importlib.metadata.version("prunefx")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _machine(timed: Latency | None = None) -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count() or 0,
        "python": platform.python_version(),
        "torch": torch.__version__,
        # the threads latency was timed with, stated once (torch's count now may differ after training)
        "torch_threads": timed.threads if timed is not None else torch.get_num_threads(),
    }


def _timing(stages: Sequence[Stage]) -> dict[str, Any] | None:
    """How the latencies were timed, once for the report: backend, threads, rounds, load average, noise."""
    timed = [s.latency for s in stages if s is not None and s.latency is not None]
    if not timed:
        return None
    first = timed[0]
    loads = [t.load_avg for t in timed if t.load_avg is not None]
    return {
        "backend": first.backend,
        "deployed": first.deployed,
        "device": first.device,
        "threads": first.threads,
        "batch_size": first.batch_size,
        "rounds": first.rounds,
        "alternating": len({t.rounds for t in timed}) == 1 and first.rounds > 1,
        "load_avg": max(loads) if loads else None,
        "cpu_count": first.cpu_count,
        "noise": next((t.noise for t in timed if t.noise), None),
    }


def build_report(
    *,
    model: str,
    baseline: Stage,
    pruned: Stage,
    finetuned: Stage | None = None,
    widths: Sequence[tuple[str, int, int]] = (),
    sweep: Sequence[SweepPoint] = (),
    settings: Mapping[str, Any] | None = None,
    warnings: Sequence[str] = (),
    controls: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble a validated ``report.json`` dict (schema in this module's docstring) from plain data.

    ``widths`` holds ``(name, before, after)`` per pruned group; ``settings`` (JSON-able) is stored as is;
    ``warnings`` are sentences about what the numbers cannot support (report.md lists them first).
    ``controls``: ``{"metric", "total_epochs", "finetune_epochs", "runs": [(name, what, epochs, Stage), ...]}`` and
    optionally ``"chance"`` (the metric of a guess, e.g. 1/classes for top-1: scores at or below it get no verdict).

    >>> build_report(model="resnet50", baseline=Stage(measure(m0, x)), pruned=Stage(measure(m1, x)))
    """
    stages = {"baseline": _stage_dict(baseline, None), "pruned": _stage_dict(pruned, baseline)}
    if finetuned is not None:
        stages["finetuned"] = _stage_dict(finetuned, baseline)
    report = {
        "schema": SCHEMA,
        "model": model,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "prunefx": _version(),
        "machine": _machine(baseline.latency or pruned.latency),
        "timing": _timing([baseline, pruned, finetuned]),
        "conventions": {
            **COUNT_CONVENTIONS,
            "latency": LATENCY_CONVENTION,
            "delta": "abs = stage - baseline; rel = abs / baseline",
            "units": "GMACs/GFLOPs = 1e9, params (M) = 1e6 elements, size (MB) = 1e6 bytes of torch.save(state_dict)",
        },
        "settings": dict(settings or {}),
        "stages": stages,
        "widths": [{"name": n, "before": int(b), "after": int(a)} for n, b, a in widths],
        "sweep": [{"ratio": float(p.ratio), **_cost_row(p.measurement, p.metrics)} for p in sweep],
        "warnings": [str(w) for w in warnings],
    }
    if controls is not None:
        report["controls"] = {
            "metric": str(controls["metric"]),
            "total_epochs": int(controls["total_epochs"]),
            "finetune_epochs": int(controls["finetune_epochs"]),
            "runs": [{"name": name, "what": what, "epochs": int(epochs), **_cost_row(st.measurement, st.metrics)}
                     for name, what, epochs, st in controls["runs"]],
        }
        if controls.get("chance") is not None:
            report["controls"]["chance"] = float(controls["chance"])
    try:
        json.dumps(report["settings"], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ReportError(
            f"settings must be JSON-serializable ({exc}); pass plain str/number/list/dict values."
        ) from exc
    validate_report(report)
    return report


def validate_report(report: Any) -> Report:
    """The report as :class:`Report`, or ReportError naming the first way ``report`` departs from the schema."""
    if not isinstance(report, dict):
        raise ReportError(f"a report is a JSON object, got {type(report).__name__}.")
    try:
        return Report.from_dict(report)
    except ReportError as exc:
        raise ReportError(f"invalid report: {exc}; rebuild it with build_report()") from exc


# ---- files ------------------------------------------------------------------------------------------


def load_report(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate ``run_dir/report.json`` (as written by ``prunefx.report.write.write_report``)."""
    path = Path(run_dir) / JSON_NAME
    report = read_json(path, ReportError, what="is not valid JSON",
                       missing=f"no {JSON_NAME} in {run_dir}; pass the run directory a pruning run wrote.",
                       fix="re-run the pruning to regenerate it.", expect=dict)
    try:
        validate_report(report)
    except ReportError as exc:  # the file named: a report.json in a shared run directory may be anyone's
        raise ReportError(f"{path}: {exc}") from None
    return report
