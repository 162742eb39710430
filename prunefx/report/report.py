"""Pruning-run report: build it from plain measurements, validate it, write it atomically, load it back.

``report.json`` (schema ``prunefx.report/1``)::

    {
      "schema": "prunefx.report/1",
      "model": str,                       # what was pruned, e.g. "torchvision:resnet50"
      "created": str,                     # ISO-8601 UTC timestamp
      "prunefx": str,                     # package version
      "machine": {"platform": str, "machine": str, "processor": str, "cpu_count": int,
                  "python": str, "torch": str, "torch_threads": int},   # threads: those latency was timed with
      "timing": null | {"backend", "deployed", "device": str, "threads", "batch_size", "rounds": int,
                        "alternating": bool, "load_avg": float | null, "cpu_count": int | null,
                        "noise": str | null},   # how latency was timed, once; noise: why it is unreliable
      "conventions": {str: str},          # how MACs, FLOPs (= 2 x MACs), norms, latency, deltas are counted
      "settings": {...},                  # the caller's run settings, verbatim
      "stages": {                         # "baseline" and "pruned" always, "finetuned" optionally
        "<stage>": {
          "macs": int, "flops": int,      # flops == 2 * macs
          "params": int, "buffers": int, "size_bytes": int | null,   # null: model on the meta device
          "per_module_macs": {str: int}, "per_op_macs": {str: int}, "uncounted_ops": [str],
          "input_shapes": [[int]], "ran_on": str,
          "latency": null | {"median_ms", "p10_ms", "p90_ms", "min_ms", "mean_ms": float,
                             "repeats", "warmup", "batch_size", "threads": int,
                             "device", "torch_version": str, "channels_last": bool,
                             "noise": str | null, ...},   # noise: why this timing is unreliable
          "metrics": {str: number},       # task metrics: top1, map50_95, ...
          "delta": {str: {"abs": number, "rel": number | null}},          # cost vs baseline ({} for it);
                                          # latency_median_ms also has "noise": str when either timing is noisy
          "metrics_delta": {str: {"abs": number, "rel": number | null}}   # shared metrics vs baseline
        }
      },
      "widths": [{"name": str, "before": int, "after": int}],             # per pruned group / layer
      "sweep": [{"ratio": number, "macs": int, "flops": int, "params": int, "metrics": {str: number}}]
    }

Deltas: ``abs = stage - baseline`` and ``rel = abs / baseline`` (null when the baseline is 0); cost
deltas cover macs, flops, params, size_bytes (when both are known) and, when both stages were timed,
latency_median_ms.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from prunefx._io import atomic_write
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
) -> dict[str, Any]:
    """Assemble a validated ``report.json`` dict (schema in this module's docstring) from plain data.

    ``widths`` holds ``(name, before, after)`` per pruned group; ``settings`` (JSON-able) is stored as is.

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
        "sweep": [
            {
                "ratio": float(p.ratio),
                "macs": p.measurement.macs,
                "flops": p.measurement.flops,
                "params": p.measurement.params,
                "metrics": {k: float(v) for k, v in p.metrics.items()},
            }
            for p in sweep
        ],
    }
    try:
        json.dumps(report["settings"], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ReportError(
            f"settings must be JSON-serializable ({exc}); pass plain str/number/list/dict values."
        ) from exc
    validate_report(report)
    return report


# ---- validation -----------------------------------------------------------------------------------

_INT, _NUM, _STR, _BOOL = "int", "number", "str", "bool"


def _is(value: Any, kind: str) -> bool:
    if kind == _BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass; True is not a MAC count
        return False
    if kind == _INT:
        return isinstance(value, int)
    if kind == _NUM:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, str)


_LATENCY_FIELDS = {
    **dict.fromkeys(("median_ms", "p10_ms", "p90_ms", "min_ms", "mean_ms"), _NUM),
    **dict.fromkeys(("repeats", "warmup", "batch_size", "threads"), _INT),
    "device": _STR,
    "torch_version": _STR,
    "channels_last": _BOOL,
}
_STAGE_SCALARS = {**dict.fromkeys(("macs", "flops", "params", "buffers"), _INT), "ran_on": _STR}


def _check_scalars(obj: Mapping[str, Any], fields: Mapping[str, str], where: str, problems: list[str]) -> None:
    for key, kind in fields.items():
        if key not in obj:
            problems.append(f"{where}: missing '{key}'")
        elif not _is(obj[key], kind):
            problems.append(f"{where}.{key}: expected {kind}, got {obj[key]!r}")


def _check_mapping(obj: Any, kind: str, where: str, problems: list[str]) -> None:
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    problems.extend(f"{where}.{k}: expected {kind}, got {v!r}" for k, v in obj.items() if not _is(v, kind))


def _check_deltas(obj: Any, where: str, problems: list[str]) -> None:
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    for key, d in obj.items():
        if not (isinstance(d, dict) and _is(d.get("abs"), _NUM) and (d.get("rel") is None or _is(d["rel"], _NUM))):
            problems.append(f"{where}.{key}: expected {{'abs': number, 'rel': number|null}}, got {d!r}")


def _check_stage(stage: Any, where: str, problems: list[str]) -> None:
    if not isinstance(stage, dict):
        problems.append(f"{where}: expected an object, got {type(stage).__name__}")
        return
    _check_scalars(stage, _STAGE_SCALARS, where, problems)
    if "size_bytes" not in stage:
        problems.append(f"{where}: missing 'size_bytes' (null when unknown)")
    elif stage["size_bytes"] is not None and not _is(stage["size_bytes"], _INT):
        problems.append(f"{where}.size_bytes: expected int or null, got {stage['size_bytes']!r}")
    if _is(stage.get("macs"), _INT) and _is(stage.get("flops"), _INT) and stage["flops"] != 2 * stage["macs"]:
        problems.append(f"{where}: flops ({stage['flops']}) must be 2 x macs ({stage['macs']})")
    for key in ("per_module_macs", "per_op_macs"):
        _check_mapping(stage.get(key), _INT, f"{where}.{key}", problems)
    if not (isinstance(stage.get("uncounted_ops"), list) and all(_is(o, _STR) for o in stage["uncounted_ops"])):
        problems.append(f"{where}.uncounted_ops: expected a list of op names")
    if not isinstance(stage.get("input_shapes"), list):
        problems.append(f"{where}.input_shapes: expected a list of shapes")
    if "latency" not in stage:
        problems.append(f"{where}: missing 'latency' (null when not timed)")
    elif stage["latency"] is not None:
        if isinstance(stage["latency"], dict):
            _check_scalars(stage["latency"], _LATENCY_FIELDS, f"{where}.latency", problems)
        else:
            problems.append(f"{where}.latency: expected an object or null")
    _check_mapping(stage.get("metrics"), _NUM, f"{where}.metrics", problems)
    _check_deltas(stage.get("delta"), f"{where}.delta", problems)
    _check_deltas(stage.get("metrics_delta"), f"{where}.metrics_delta", problems)


def _list(report: Mapping[str, Any], key: str, problems: list[str]) -> list[tuple[int, dict[str, Any]]]:
    """(index, object) pairs of list ``report[key]``; anything else is recorded as a problem and skipped."""
    items = report.get(key)
    if not isinstance(items, list):
        problems.append(f"{key}: expected a list")
        return []
    problems.extend(f"{key}[{i}]: expected an object" for i, item in enumerate(items) if not isinstance(item, dict))
    return [(i, item) for i, item in enumerate(items) if isinstance(item, dict)]


def validate_report(report: Any) -> None:
    """Raise ReportError listing every way ``report`` departs from the ``prunefx.report/1`` schema."""
    if not isinstance(report, dict):
        raise ReportError(f"a report is a JSON object, got {type(report).__name__}.")
    problems: list[str] = []
    if report.get("schema") != SCHEMA:
        problems.append(f"schema: expected {SCHEMA!r}, got {report.get('schema')!r}")
    _check_scalars(report, {"model": _STR, "created": _STR, "prunefx": _STR}, "report", problems)
    for key in ("machine", "conventions", "settings"):
        if not isinstance(report.get(key), dict):
            problems.append(f"{key}: expected an object")
    stages = report.get("stages")
    if not isinstance(stages, dict):
        problems.append("stages: expected an object")
    else:
        problems.extend(f"stages: missing '{s}'" for s in STAGES[:2] if s not in stages)
        allowed = ", ".join(STAGES)
        problems.extend(f"stages: unknown stage '{s}' (allowed: {allowed})" for s in stages if s not in STAGES)
        for name, stage in stages.items():
            _check_stage(stage, f"stages.{name}", problems)
    for i, w in _list(report, "widths", problems):
        _check_scalars(w, {"name": _STR, "before": _INT, "after": _INT}, f"widths[{i}]", problems)
    for i, p in _list(report, "sweep", problems):
        _check_scalars(p, {"ratio": _NUM, "macs": _INT, "flops": _INT, "params": _INT}, f"sweep[{i}]", problems)
        _check_mapping(p.get("metrics"), _NUM, f"sweep[{i}].metrics", problems)
    if problems:
        raise ReportError("invalid report:\n  " + "\n  ".join(problems) + "\nRebuild it with build_report().")


# ---- files ------------------------------------------------------------------------------------------


def write_report(run_dir: str | os.PathLike[str], report: dict[str, Any]) -> list[Path]:
    """Validate ``report`` and write report.json, report.md, report.html and its PNG plots into ``run_dir``.

    Returns the written paths. ``widths.png`` needs widths; ``accuracy_vs_flops.png`` needs a sweep
    of at least two points with a shared metric.
    """
    from prunefx.report.plots import accuracy_vs_flops_png, plottable_metric, widths_png
    from prunefx.report.render import render_markdown
    from prunefx.report.report_html import load_graph, report_html

    validate_report(report)
    out = Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {JSON_NAME: (json.dumps(report, indent=2, allow_nan=False) + "\n").encode()}
    if report["widths"]:
        target = (report.get("settings") or {}).get("target")
        if isinstance(target, Mapping):
            target = ", ".join(f"{k} {v}" for k, v in target.items())
        title = f"{report['model']}" + (f", target: {target}" if target else "")
        files["widths.png"] = widths_png(report["widths"], title)
    if plottable_metric(report["sweep"]) is not None:
        files["accuracy_vs_flops.png"] = accuracy_vs_flops_png(report["sweep"], report["stages"]["baseline"])
    files["report.md"] = render_markdown(report, plots=[n for n in files if n.endswith(".png")]).encode()
    files["report.html"] = report_html(report, load_graph(out)).encode()  # the graph from graph.json, when there
    for name, data in files.items():
        atomic_write(out / name, data)
    return [out / name for name in files]


def load_report(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate ``run_dir/report.json`` (as written by :func:`write_report`)."""
    path = Path(run_dir) / JSON_NAME
    _check_finished(Path(run_dir))
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"no {JSON_NAME} in {run_dir}; pass the run directory a pruning run wrote.") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path} is not valid JSON ({exc}); re-run the pruning to regenerate it.") from exc
    validate_report(report)
    return report


def _check_finished(run_dir: Path) -> None:
    """A pipeline run (it has a state.json) counts only once its last stage finished."""
    state_path = run_dir / "state.json"
    if not state_path.is_file():
        return
    try:
        state = json.loads(state_path.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{state_path} is corrupt ({exc}); the run cannot be trusted, re-run it") from exc
    if state.get("status") != "complete":
        err = state.get("error") or {}
        detail = f"{err.get('type')}: {err.get('message', '')[:200]}"
        where = f" in stage {err['stage']!r} ({detail})" if err.get("stage") else ""
        raise ReportError(
            f"the run in {run_dir} is not complete (status {state.get('status')!r}{where}); "
            "continue it with the same config plus resume=true"
        )
