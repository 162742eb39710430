"""Measure each group's sensitivity: how much cutting it alone to a few widths changes the model's outputs.

    curves = prunefx.sensitivity.measure(model, dg, scores, calibration=[x1, x2])
    plan = prunefx.make_plan(dg, scores, PlanConfig(flops=0.5, scope="sensitivity"), cost=cost, sensitivity=curves)

For every eligible group (the groups ``make_plan`` would plan) and every keep fraction, a copy of the model is
pruned with only that group (and the partners an equal-count tie binds it to) cut, its lowest-scored channels
removed, biases compensated as ``prunefx.prune`` does for the criterion (or, with ``refit=True``, the layers that
read the cut channels re-fitted by :func:`prunefx.transform.refit` on the calibration batches, as
``prunefx.prune(..., refit=True)`` will do after the real cut), and run on the calibration batches in evaluation
mode. The damage is ``||y_pruned - y|| / ||y||`` over every output leaf of every batch (leaves whose
shape the cut changes, pruned free outputs, are not compared), or with ``loss_fn`` the increase of the mean loss.

**Cost.** One reference pass over the batches, then per measured unit (a group, or a tie set) and fraction one
pass over the batches plus one for the bias compensation's means: ``units x fractions x (batches + 1) + batches``
forwards, and a deep copy of the model per unit and fraction. With ``refit=True`` there is no compensation pass;
instead the re-fit runs the unpruned model once over the batches for its targets and the pruned copy once per
re-fitted layer (each pass stopped right after that layer, counted as a whole pass), and solves two small
least-squares systems per layer and conv group (the held-out check and the final fit):
``units x fractions x (2 + L) x batches + batches`` forwards, L the layers reading the unit's channels (1 to 3 in a
CNN), and ``units x fractions x 2 L`` solves. ``SensitivityCurves.forwards`` records the forwards.
Damage with the re-fit is measured on the batches it was fitted on, as the cut's own re-fit is.

**Cache.** The curves are stored as JSON under ``$PRUNEFX_CACHE_DIR/sensitivity`` (default
``.cache/sensitivity`` in the working directory; the latency table's convention), one file per key: the analysis
fingerprint, a hash of the state_dict, of the calibration tensors and of the scores, the fractions, the criterion,
the loss function's name, whether biases are compensated and whether (with which ridge, rows and holdout) the
layers are re-fitted. The same key again (re-planning to another target)
runs no forward; groups the file lacks (another config's eligible groups) are measured and added to it.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from prunefx._io import atomic_write
from prunefx.analysis import DependencyGraph
from prunefx.analysis.outputs import output_leaves
from prunefx.capture.inputs import Inputs, positional
from prunefx.importance import Scores, compensates
from prunefx.plan import GroupPlan, PlanConfig, PlanError, PruningPlan
from prunefx.plan.sensitivity import GroupCurve, SensitivityCurves
from prunefx.plan.solve import _eligible, _keep
from prunefx.transform import apply_plan, compensate, owned_modules
from prunefx.transform import refit as refit_layers
from prunefx.transform.refit import DEFAULT_HOLDOUT, DEFAULT_MAX_ROWS, DEFAULT_RIDGE

DEFAULT_FRACTIONS = (0.75, 0.5, 0.25)


def default_cache_dir() -> Path:
    """``$PRUNEFX_CACHE_DIR/sensitivity``, else ``.cache/sensitivity`` in the working directory."""
    root = os.environ.get("PRUNEFX_CACHE_DIR")
    return (Path(root) if root else Path(".cache")) / "sensitivity"


def calibration_batches(
    calibration: Iterable[Any] | None, loss_fn: Callable | None = None, model: nn.Module | None = None
) -> list[tuple]:
    """The calibration data as a list of (positional inputs, targets), by the rule ``prunefx.prune`` reads it: a
    2-tuple is ``(inputs, targets)``, inputs are a tensor, a list of positional inputs, or keyword inputs (a
    mapping or :class:`~prunefx.capture.inputs.Inputs`, bound by ``model``'s forward); targets None otherwise
    (``loss_fn`` needs them). Raises PlanError when there is no batch or one is malformed."""
    if calibration is None:
        raise PlanError("measuring sensitivity needs calibration data: pass calibration=[x, ...] (a few batches of "
                        "model inputs; with loss_fn, (inputs, targets) pairs)")
    items = [calibration] if isinstance(calibration, torch.Tensor) else list(calibration)
    if not items:
        raise PlanError("calibration is empty: give at least one batch of model inputs (calibration=[x])")
    out = []
    for i, item in enumerate(items):
        inputs, targets = item if isinstance(item, tuple) and len(item) == 2 else (item, None)
        if loss_fn is not None and targets is None:
            raise PlanError(f"calibration batch {i}: with loss_fn each batch is an (inputs, targets) pair")
        if isinstance(inputs, torch.Tensor):
            out.append(((inputs,), targets))
        elif isinstance(inputs, (list, tuple)):
            out.append((tuple(inputs), targets))
        elif isinstance(inputs, (Mapping, Inputs)) and model is not None:
            out.append((positional(model, inputs), targets))
        else:
            raise PlanError(f"calibration batch {i} is a {type(inputs).__name__}; pass batches of model inputs (a "
                            "tensor, a list of positional inputs or a dict of keyword inputs) or (inputs, targets) "
                            "pairs")
    return out


def measure(
    model: nn.Module,
    dg: DependencyGraph,
    scores: Scores | Mapping[int, np.ndarray],
    calibration: Iterable[Any],
    *,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    compensate_bias: bool | None = None,
    config: PlanConfig | None = None,
    example_inputs: Sequence[Any] | None = None,
    cache: str | os.PathLike[str] | None = "default",
    refit: bool = False,
) -> SensitivityCurves:
    """Damage curves of every group ``make_plan(dg, scores, config)`` would plan (see the module for how and cost).

    ``scores``: which channels go first (lowest first), as the plan will choose them. ``fractions``: keep fractions
    measured, in (0, 1). ``compensate_bias``: fold the removed channels' means into their consumers first (default:
    the criterion's registration, as ``prunefx.prune``), their means taken on ``example_inputs`` (default: the
    first calibration batch; ``prunefx.prune`` passes its example input). ``config``: which groups are eligible
    (ignore, min_channels, graph_rewrite; default ``PlanConfig()``). ``cache``: "default"
    (:func:`default_cache_dir`), a folder, or None (not cached). ``refit``: re-fit the layers reading each cut
    group before measuring (``prunefx.prune(..., refit=True)``'s recovery; it replaces bias compensation, so
    ``compensate_bias`` must not be True). ``model`` is never modified.
    """
    start = time.perf_counter()
    criterion, values = (scores.criterion, scores.values) if isinstance(scores, Scores) else ("custom", scores)
    fr = tuple(sorted({float(f) for f in fractions}, reverse=True))
    if not fr or any(not 0.0 < f < 1.0 for f in fr):
        raise PlanError(f"fractions are keep fractions in (0, 1), e.g. (0.75, 0.5, 0.25); got {tuple(fractions)}")
    batches = calibration_batches(calibration, loss_fn, model)
    cfg = config or PlanConfig()
    if refit and compensate_bias:
        raise PlanError("refit=True replaces bias compensation (it re-solves each bias); leave compensate_bias "
                        "unset or False")
    compensated = not refit and (compensates(criterion) if compensate_bias is None else compensate_bias)
    comp_inputs = tuple(example_inputs) if example_inputs is not None else batches[0][0]
    with warnings.catch_warnings():  # make_plan warns about unused ignore patterns; once is enough
        warnings.simplefilter("ignore")
        eligible, _ = _eligible(dg, cfg, owned_modules(model))
    missing = [g for g in eligible if g not in values or len(values[g]) != dg.groups[g].channels]
    if missing:
        raise PlanError(f"scores missing or of wrong length for groups {missing[:5]}")
    key = _key(model, dg, batches, fr, criterion, values, loss_fn, compensated, refit)
    path = _cache_path(cache, dg, key)
    have = _load(path, key)
    units = [u for u in _units(dg, eligible) if have is None or any(have.get(g) is None for g in u)]
    if not units:
        return have
    was = {m: m.training for m in model.modules()}
    try:
        reference = _run(model, batches, loss_fn)
    finally:
        for m, flag in was.items():
            m.train(flag)
    measured: list[GroupCurve] = []
    for unit in units:
        c = dg.groups[unit[0]].channels
        widths = sorted({min(c - 1, max(1, round(f * c))) for f in fr}, reverse=True)
        damage, forwards = [], 0
        for n in widths:
            plan = _single(dg, values, unit, n, criterion)
            work, gm = copy.deepcopy((model, dg.gm))  # one memo: the copied graph shares the copied modules
            work_dg = replace(dg, gm=gm)
            if compensated:
                compensate(work, work_dg, plan, comp_inputs)
                forwards += 1
            pruned = apply_plan(work, work_dg, plan, graph_rewrite=cfg.graph_rewrite)
            calls: list[int] = []  # the pruned copy's forwards: the re-fit's per-layer passes and the measurement's
            counter = pruned.register_forward_pre_hook(lambda *_, calls=calls: calls.append(1))
            if refit:
                done = refit_layers(model, pruned, work_dg, plan, [inputs for inputs, _ in batches])
                forwards += done.original_passes  # the unpruned model's passes for the re-fit's targets
            damage.append(_damage(reference, _run(pruned, batches, loss_fn), loss_fn is not None))
            counter.remove()
            forwards += len(calls)
        share = len(unit)  # a tie set measured together: each member carries an equal share of its damage
        for g in unit:
            measured.append(GroupCurve(
                group=g, channels=c, keep=tuple(n / c for n in widths), damage=tuple(d / share for d in damage),
                forwards=forwards if g == unit[0] else 0, label=dg.groups[g].label, tied=unit if len(unit) > 1 else (),
            ))
    curves = SensitivityCurves(
        tuple(sorted(measured, key=lambda x: x.group)), "loss_increase" if loss_fn is not None else
        "relative_output_error", key, dg.fingerprint(), len(batches), time.perf_counter() - start, refit,
    )
    if have is not None:
        curves = curves.merged(have)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, curves.to_json().encode())
    return curves


def _units(dg: DependencyGraph, eligible: list[int]) -> list[tuple[int, ...]]:
    """Eligible groups, joined where an equal-count tie binds them (cut one, cut all); a tie with a partner that
    is not eligible keeps them all whole, so none is measured."""
    eligible_set, seen, units = set(eligible), set(), []
    for gids, _ in dg.ties:
        if not seen.isdisjoint(gids):
            continue  # overlapping ties are rare; the first one measured stands for them
        seen.update(gids)
        if set(gids) <= eligible_set:
            units.append(tuple(gids))
    return units + [(g,) for g in eligible if g not in seen]


def _single(dg: DependencyGraph, values: Mapping[int, np.ndarray], unit: tuple[int, ...], n: int,
            criterion: str) -> PruningPlan:
    """A plan that cuts only ``unit``'s groups to ``n`` channels, lowest scores first (as make_plan keeps them)."""
    groups = tuple(
        GroupPlan(group=g, before=dg.groups[g].channels, after=n,
                  keep=tuple(np.flatnonzero(_keep(np.asarray(values[g]), n)).tolist()),
                  why="measuring sensitivity", label=dg.groups[g].label)
        for g in unit
    )
    return PruningPlan(model=dg.model_name, fingerprint=dg.fingerprint(), input_shapes=dg.input_shapes,
                       criterion=criterion, target={"sensitivity": n}, groups=groups, frozen=dg.frozen_by_check,
                       input_kinds=dg.input_kinds)


def _run(model: nn.Module, batches: list[tuple], loss_fn: Callable | None) -> list:
    """Per batch: the output's float leaves (or, with ``loss_fn``, the loss), in evaluation mode, without grad."""
    model.eval()
    out = []
    with torch.no_grad():
        for inputs, targets in batches:
            y = model(*inputs)
            if loss_fn is not None:
                out.append(float(loss_fn(y, targets)))
            else:
                out.append([leaf.detach().float() for _, leaf in output_leaves(y)
                            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()])
    return out


def _damage(reference: list, pruned: list, is_loss: bool) -> float:
    """Relative output error over every comparable leaf of every batch, or the increase of the mean loss."""
    if is_loss:
        return float(np.mean(pruned) - np.mean(reference))
    diff = ref = 0.0
    compared = 0
    for want, got in zip(reference, pruned, strict=True):
        for a, b in zip(want, got, strict=False):
            if a.shape != b.shape:
                continue  # a free output the cut narrows: its channels are gone, not changed
            diff += float(((b - a).double() ** 2).sum())
            ref += float((a.double() ** 2).sum())
            compared += 1
    if not compared:
        raise PlanError("the model's outputs cannot be compared after a cut (no floating-point output keeps its "
                        "shape); pass loss_fn to measure sensitivity as the increase of a loss instead")
    return float(np.sqrt(diff) / np.sqrt(ref)) if ref > 0 else float(np.sqrt(diff))


def _hash_tensor(h: Any, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def _hash_value(h: Any, x: Any) -> None:
    """Tensors by their bytes, containers element by element, anything else by its repr."""
    if isinstance(x, torch.Tensor):
        _hash_tensor(h, x)
    elif isinstance(x, (tuple, list)):
        h.update(f"[{len(x)}".encode())
        for v in x:
            _hash_value(h, v)
    elif isinstance(x, Mapping):
        for k in sorted(x, key=str):
            h.update(str(k).encode())
            _hash_value(h, x[k])
    else:
        h.update(repr(x).encode())


def _key(model, dg, batches, fractions, criterion, values, loss_fn, compensated, refit) -> str:
    """sha256 of everything the curves depend on (see the module's Cache)."""
    h = hashlib.sha256()
    h.update(f"{dg.fingerprint()}|{fractions}|{criterion}|{compensated}|".encode())
    if refit:  # only then: keys of curves measured without a re-fit stay what they were
        h.update(f"refit|{DEFAULT_RIDGE}|{DEFAULT_MAX_ROWS}|{DEFAULT_HOLDOUT}|".encode())
    h.update(getattr(loss_fn, "__qualname__", repr(loss_fn)).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        _hash_tensor(h, t)
    _hash_value(h, batches)
    for g in sorted(values):
        h.update(f"g{g}".encode())
        h.update(np.ascontiguousarray(values[g], dtype=np.float64).tobytes())
    return h.hexdigest()


def _cache_path(cache: str | os.PathLike[str] | None, dg: DependencyGraph, key: str) -> Path | None:
    if cache is None:
        return None
    folder = default_cache_dir() if str(cache) == "default" else Path(cache)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", dg.model_name or "model")[:60]
    return folder / f"{name}-{key[:20]}.json"


def _load(path: Path | None, key: str) -> SensitivityCurves | None:
    """The cached curves for ``key``, or None (no file, another key, or a file that does not parse)."""
    if path is None or not path.is_file():
        return None
    try:
        curves = SensitivityCurves.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError, PlanError):
        return None  # a damaged cache file is measured again and overwritten
    return curves if curves.key == key else None


__all__ = ["DEFAULT_FRACTIONS", "calibration_batches", "default_cache_dir", "measure"]
